"""Vertical federated gradient boosting.

Two floors live in this package:

* ``vfl.core``: the learner core (binning, objectives, split finding, the grower, the boosting
  loop, sampling, metrics, the model, the DP mechanisms). It sits below ``parties`` and imports
  no ``crypto``, ``protocols`` or ``parties`` module.
* the public face, above ``parties``: ``vfl.api`` (``ActiveParty``, ``PassiveParty``,
  ``Federation``, ``load_federation``, ``simulate``), ``vfl.estimators`` (the scikit-learn
  estimators) and ``vfl.compare``.

This module re-exports only the core's vocabulary (``from vfl import TrainParams`` loads no party,
transport or crypto module). It imports nothing from the face: the face imports ``parties``, which
imports the core, so a re-export here would be a cycle. Import the face from its modules::

    from vfl.api import ActiveParty, PassiveParty, Federation
    from vfl.estimators import VerticalBoostingClassifier
"""

from vfl.core.params import Alignment, Encryption, Mode, Objective, Prediction, TrainParams

__version__ = "0.1.0"

__all__ = ["Alignment", "Encryption", "Mode", "Objective", "Prediction", "TrainParams"]
