"""Vertical federated gradient boosting: public entry points.

The learner core's names (``TrainParams`` and the vocabulary enums) are imported
directly: ``from vfl import TrainParams`` loads no party, transport or crypto module
of the party stack. The party-wiring names (``ActiveParty``, ``PassiveParty``,
``Federation``, ``load_federation``, the scikit-learn estimators) are loaded on first
access through a module ``__getattr__`` (PEP 562), because they live above the core
(``vfl.api`` imports ``parties``, which imports the core).
"""

import importlib

from vfl.params import Alignment, Encryption, Mode, Objective, Prediction, TrainParams

__version__ = "0.1.0"

__all__ = ["Alignment", "Encryption", "Mode", "Objective", "Prediction", "TrainParams",
           "ActiveParty", "PassiveParty", "Federation", "load_federation",
           "VerticalBoostingClassifier", "VerticalBoostingRegressor"]

_LAZY = {  # name -> the public-face module that defines it (PEP 562 lazy attributes)
    "ActiveParty": "vfl.api", "PassiveParty": "vfl.api", "Federation": "vfl.api", "load_federation": "vfl.api",
    "VerticalBoostingClassifier": "vfl.estimators", "VerticalBoostingRegressor": "vfl.estimators",
}


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'vfl' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
