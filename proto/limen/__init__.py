"""limen wire bindings (generated from proto/limen/env/v1/env.proto by `make proto`)."""
