"""Support code shared by the tests (importable as ``support.*``: ``pytest`` puts ``tests/`` on ``sys.path``)."""
