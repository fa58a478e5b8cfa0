"""For subprocesses of the tests (on their PYTHONPATH): when $LAB_KAGGLE_STANDIN names a state file, kaggle's API
module, once imported, gets the stand-in for its network calls (tests/kaggle_standin.py). Nothing happens otherwise."""

import importlib.abc
import importlib.util
import os
import sys


class _StandIn(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "kaggle.api.kaggle_api_extended":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            sys.modules[name] = module
            sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            import kaggle_standin

            kaggle_standin.install(os.environ["LAB_KAGGLE_STANDIN"])

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("LAB_KAGGLE_STANDIN"):
    sys.meta_path.insert(0, _StandIn())
