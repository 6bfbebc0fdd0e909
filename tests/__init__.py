"""Benanza's tests, in folders that mirror the package (docs/contributing.md, "Where a test goes").

Each folder is a package, so two test files may share a name in different folders and a test
file imports another's functions by its full name (``from tests.analysis.test_bounds_e2e import
JSON_MS``); the shared helpers at this folder's root import by their own name (conftest.py puts
this folder on the path)."""
