"""nsqpy: the NSQ realtime messaging platform, rebuilt in Python and wire-compatible."""

__version__ = "0.1.0"

# The NSQ release whose behaviour (wire protocol, HTTP API, on-disk formats) nsqpy matches.
NSQ_VERSION = "1.3.0"

__all__ = ["NSQ_VERSION", "__version__"]
