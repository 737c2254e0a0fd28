"""limen's trainer client: rollouts over the env pool, the policy and its readout, the learner."""

import os

# Idle OpenMP threads that spin instead of sleeping cost up to 10x on a busy machine (measured: generation on
# 2 shared cores). OpenMP reads this once, when torch loads: every entry point imports this package first.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
