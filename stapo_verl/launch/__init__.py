"""What the recipes call, around verl's own start-up: :mod:`.compose` (verl's trainer config composed as ``main_ppo``
composes it), :mod:`.dryrun` (``--dry-run``) with :mod:`.recipe_rules` (the rules verl checks only on GPUs, or not at
all), :mod:`.train` with :mod:`.resume` (the tiny run's launcher), :mod:`.console` (the run's terminal view). The stop-token generation config they write is
:mod:`stapo_verl.stop_tokens`, shared with the CPU platform and the evaluation. Importing this package imports nothing
else."""
