"""metralectl — the operator's cockpit for boxes running the Metrale inference engine."""

__version__ = "0.1.0"
