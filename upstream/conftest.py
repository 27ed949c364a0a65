"""pytest: upstream/src/ holds verl test files of the patch series; they run only inside a patched verl tree.

``scripts/check_upstream.sh`` runs them there; a bare ``pytest`` at this repository's root must not collect them
(they import modules the installed verl 0.9.1 lacks).
"""

collect_ignore_glob = ["src/*"]
