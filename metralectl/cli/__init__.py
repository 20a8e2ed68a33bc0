"""Command-line front end: parse -> core -> render. No logic that the TUI or agent would need."""
