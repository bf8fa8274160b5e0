"""The learner core: binning, objectives, split finding, the grower, the boosting loop, sampling,
metrics, the model and the DP mechanisms.

It sits below ``parties`` and above ``protocols``; it imports no ``crypto``, ``protocols`` or
``parties`` module (an import-linter contract says so): a round's gradients leave it as fixed-point
integers with their bounds (``vfl.core.rounds``), and the parties encrypt and ship them.
"""
