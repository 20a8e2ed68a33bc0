"""Modal screens: confirmation, live progress of an action, error detail, benchmark run detail."""
