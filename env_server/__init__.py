"""limen env server: hosts registered text environments behind the limen.env.v1 gRPC contract."""

__version__ = "0.1.0"
