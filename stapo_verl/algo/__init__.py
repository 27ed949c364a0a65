"""Pure mask maths (torch only, no verl): the source the upstream series' S2T module is generated from, and the
allowed values of its parameters (:mod:`.config_ranges`). Nothing here imports verl, directly or through
:mod:`stapo_verl.core`: a module imported before verl would otherwise start verl's plugin loading halfway through
its own import (see :mod:`stapo_verl.plugin`)."""
