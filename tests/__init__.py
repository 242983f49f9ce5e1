"""dtppo's tests, a package: test modules import what they share from ``tests.support`` (pytest's default import
mode puts the repository root on sys.path; a process a test starts gets it through PYTHONPATH or its cwd)."""
