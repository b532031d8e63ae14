"""Step 2b: sampling the gradient-matching density.

``target`` (what a density offers the sampler) -> ``kernel`` (the chain state, the state
sweep, the paper's element-wise step) and ``block`` (the default block step, with
``conditional``: the observed states' Gaussian given the parameters) -> ``adapt`` (burn-in
tuning) -> ``schemes`` (a step with its tuning, by name) -> ``start`` (where chains begin)
-> ``stop`` (what a stop rule is asked and answers) -> ``driver`` (chains, worker processes, the DataTree and the typed run) -> ``pymc_step`` (the element-wise
step inside ``pm.sample``).
"""

from .block import BlockInfo, BlockParams, Coordinates, block_step
from .driver import MatchingRun, run_chains, sample
from .elementwise import ChainState, StepInfo, StepParams, step
from .pymc_step import GradientMatchingStep
from .schemes import Block, Elementwise, get_scheme
from .target import GradientMatchingTarget

__all__ = ["Block", "BlockInfo", "BlockParams", "ChainState", "Coordinates", "Elementwise", "GradientMatchingStep",
           "GradientMatchingTarget", "MatchingRun", "StepInfo", "StepParams", "block_step", "get_scheme", "run_chains", "sample", "step"]
