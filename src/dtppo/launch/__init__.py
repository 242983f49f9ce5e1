"""What runs in the launching process, before and around the ranks: preflight, model checks, the local and Ray
launchers."""
