"""limen wire bindings (env_pb2*, generated from proto/limen/env/v1/env.proto by `make proto`) and the one
hand-written definition of a step's outcome (outcome.py)."""
