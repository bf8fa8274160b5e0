"""A small credit-scoring problem shared by the credit-learner tests (issue 15)."""
import numpy as np
import pandas as pd

EDUCATION = ["edu_graduate_school_Q7", "edu_university_Q7", "edu_high_school_Q7", "edu_other_Q7"]
REGION = ["region_north_Z3", "region_south_Z3", "region_east_Z3"]


def credit_frames(n=400, seed=0):
    """A bank (label, a categorical 'segment', a numeric 'income', weights) and a bureau
    (categorical 'education' with missing values, numeric 'days_late' monotone in risk)."""
    rng = np.random.default_rng(seed)
    edu = rng.integers(0, 4, size=n)
    seg = rng.integers(0, 3, size=n)
    late = rng.integers(0, 8, size=n).astype(float)
    income = rng.normal(size=n)
    z = 0.5 * late - 1.0 - 0.8 * income + np.array([-1.0, 0.0, 1.0, 0.3])[edu] + np.array([0.5, -0.5, 0])[seg] \
        + 0.5 * np.sin(3 * late) + 0.5 * rng.normal(size=n)
    y = (z > 0).astype(int)
    ids = np.arange(n) + 1000
    education = np.array(EDUCATION, dtype=object)[edu]
    education[rng.random(n) < 0.05] = None
    bank = pd.DataFrame({"id": ids, "y": y, "segment": np.array(REGION)[seg], "income": income,
                         "w": np.where(y == 1, 3.0, 1.0)})
    bureau = pd.DataFrame({"id": ids, "education": education, "days_late": late})
    return bank, bureau
