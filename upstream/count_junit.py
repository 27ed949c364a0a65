"""Count the passed tests of a pytest junit XML file: series test files vs the rest (used by check_upstream.sh).

Usage: ``python upstream/count_junit.py RESULTS.xml SERIES_TEST_FILE...``; prints one line, exits 1 if any test
failed, errored or was skipped (a skipped test proves nothing).
"""

import sys
import xml.etree.ElementTree as ET


def main(argv: list[str]) -> int:
    """Print '<n> series tests + <m> existing verl tests passed'; return 1 on failures/errors/skips."""
    xml_path, series_files = argv[0], argv[1:]
    series = {p[: -len(".py")].replace("/", ".") for p in series_files}
    passed = {True: 0, False: 0}
    bad = []
    for case in ET.parse(xml_path).iter("testcase"):
        classname = case.get("classname", "")
        in_series = any(classname == s or classname.startswith(s + ".") for s in series)
        if any(child.tag in ("failure", "error", "skipped") for child in case):
            bad.append(f"{classname}::{case.get('name')}")
        else:
            passed[in_series] += 1
    if bad:
        print(f"{len(bad)} tests failed, errored or were skipped: {bad[:10]}")
        return 1
    print(f"{passed[True]} series tests + {passed[False]} existing verl tests passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
