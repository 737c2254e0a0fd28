"""limen env server: hosts registered text environments behind the limen.env.v1 gRPC contract."""

import os

__version__ = "0.1.0"

# As in trainer_client: spinning OpenMP threads (torch, numpy) cost up to 10x on shared cores; a user's own
# setting wins. Every env-server entry point imports this package first.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
