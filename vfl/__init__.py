"""Vertical federated gradient boosting: public entry points.

Attributes are imported lazily so that the core modules of ``vfl`` (binning,
loss, split finding, trees) can be imported by ``crypto``/``protocols``/
``parties`` without pulling in the party wiring of :mod:`vfl.api`.
"""

__version__ = "0.1.0"

_API = {
    "ActiveParty", "PassiveParty", "Federation", "TrainParams", "load_federation",
}


_ESTIMATORS = {"VerticalBoostingClassifier", "VerticalBoostingRegressor"}


def __getattr__(name):
    if name in _API:
        from vfl import api
        return getattr(api, name)
    if name in _ESTIMATORS:
        from vfl import estimators
        return getattr(estimators, name)
    raise AttributeError(f"module 'vfl' has no attribute {name!r}")
