"""Issue 37: a 1024-bit key's WeakKeyWarning is issued once per process, at the caller's line
(the user's script), not at crypto/keys.py and not once per fit of a grid search."""
import os
import subprocess
import sys
import textwrap
import warnings

import pytest

from crypto import keys
from crypto.keys import WeakKeyWarning, check_key_bits

SCRIPT = textwrap.dedent("""\
    import numpy as np, pandas as pd
    from sklearn.model_selection import GridSearchCV
    from vfl.estimators import VerticalBoostingClassifier
    X = pd.DataFrame(np.random.default_rng(0).normal(size=(80, 4)), columns=list("abcd"))
    y = (X.a > 0).astype(int)
    clf = VerticalBoostingClassifier(n_estimators=1, key_bits=1024, n_parties=2)
    GridSearchCV(clf, {"max_depth": [1, 2]}, cv=2).fit(X, y)
    """)


@pytest.mark.slow
def test_a_grid_search_warns_once_at_the_callers_line(tmp_path):
    script = tmp_path / "user_script.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300,
                         cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if "WeakKeyWarning" in ln]
    assert len(lines) == 1, res.stderr                      # 5 fits, one warning
    assert lines[0].startswith(f"{script}:7: WeakKeyWarning: 1024-bit Paillier keys"), res.stderr


def test_the_warning_points_at_the_caller_and_is_issued_once(monkeypatch):
    monkeypatch.setattr(keys, "_ISSUED", set())             # as in a fresh process
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")                    # once per location, as Python's default
        check_key_bits(1032)
        check_key_bits(1032)                                # this line: the same message again
    assert len(caught) == 1
    assert caught[0].filename == __file__ and issubclass(caught[0].category, WeakKeyWarning)


def test_an_always_filter_gets_every_warning():
    with pytest.warns(WeakKeyWarning) as rec:               # pytest.warns: "always"
        check_key_bits(1040)
        check_key_bits(1040)
    assert len(rec) == 2 and all(w.filename == __file__ for w in rec)
