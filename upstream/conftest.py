"""pytest: keep this repository's test run out of upstream/.

``upstream/src/`` holds verl test files of the patch series and ``upstream/verl_overlay/tree/`` verl's own test and
sanity files; they run only inside a verl tree (``scripts/check_upstream.sh``), and import modules the installed
verl 0.9.1 lacks.
"""

collect_ignore_glob = ["src/*", "verl_overlay/*"]
