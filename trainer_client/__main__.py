"""`python -m trainer_client` = `limen-train`."""

import sys

from trainer_client.train import main

sys.exit(main())
