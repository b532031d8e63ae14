"""Record element-wise draws from main at 6436776, before the block scheme (fixture of tests/test_sampling.py).

Run from the repository root: PYTHONPATH=. python tests/data/record_elementwise_reference.py
"""
import numpy as np
import pgpgm
from tests.test_density_sampler import _gaussian_case

density = _gaussian_case()[0]
g = pgpgm.sample(density, draws=40, tune=60, chains=2, seed=7, progressbar=False)
lv = pgpgm.load_model("lotka-volterra")
c = lv.case("x1-observed")
ds = pgpgm.simulate(lv.system, c.theta, c.x0, c.times, observed=c.observed, noise_sd=c.noise_sd, snr=c.snr, seed=1)
d2 = pgpgm.gradient_matching_density(lv.system, ds, ["x1"], gamma=c.gamma, priors=(0, 10))
t = pgpgm.sample(d2, draws=30, tune=60, chains=2, seed=11, progressbar=False)
np.savez("tests/data/elementwise_reference.npz",
         gauss_theta=g.posterior["theta"].values, gauss_x=g.posterior["x"].values, gauss_lp=g.sample_stats["lp"].values,
         lv_theta=np.stack([t.posterior[p].values for p in lv.system.parameters], -1),
         lv_x1=t.posterior["x1"].values, lv_x2=t.posterior["x2"].values, lv_lp=t.sample_stats["lp"].values)
print(g.posterior["theta"].values[:, -3:], t.posterior["theta1"].values[:, -3:])
