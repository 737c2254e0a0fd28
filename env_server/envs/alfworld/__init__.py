"""ALFWorld (alfworld 0.4.2, TextWorld PDDL engine) as a limen env, plus a procedural game generator.

Modules: env (AlfWorldEnv), games (splits on disk), engine (cached game engine + handcoded expert),
speed (output-preserving memos), generate (new games), dataset (the public data, for `limen-data fetch`).
"""

import os
import tempfile

if "ALFWORLD_DATA" not in os.environ:
    # Imported without ALFWORLD_DATA, alfworld creates ~/.cache/alfworld and exports the variable.
    # Let it see an existing folder, then take the variable back so that "no data" stays visible.
    os.environ["ALFWORLD_DATA"] = tempfile.gettempdir()
    try:
        import alfworld  # noqa: F401
    except ImportError:  # not installed (a data-only install reading dataset.py): nothing to pre-empt
        pass
    finally:
        del os.environ["ALFWORLD_DATA"]
