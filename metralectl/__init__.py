"""metralectl — the operator's cockpit for boxes running the Metrale inference engine."""

__version__ = "0.1.0"
# The distribution's name on the package index: `metralectl` there is another project's.
DISTRIBUTION = "metralectl-cockpit"
