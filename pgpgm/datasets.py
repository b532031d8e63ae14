"""Real data sets shipped with pgpgm (CSV files in ``pgpgm.models``, each with its source in its header)."""

from __future__ import annotations

from importlib import resources

import pandas as pd


def lynx_hare() -> pd.DataFrame:
    """Hudson's Bay Company pelts of snowshoe hares and Canadian lynxes, 1900-1920.

    Source: P. Howard (2009), *Modeling basics*, lecture notes for Math 442, Texas A&M
    University, as used by B. Carpenter (2018), *Predator-Prey Population Dynamics: the
    Lotka-Volterra model in Stan* (Stan case study).

    Returns
    -------
    pandas.DataFrame
        21 rows, columns ``year`` (1900..1920), ``time`` (years since 1900, float),
        ``hare`` and ``lynx`` (thousands of pelts per year, float).
    """
    with resources.files("pgpgm.models").joinpath("hudson_bay_lynx_hare.csv").open() as f:
        table = pd.read_csv(f, comment="#")
    table.insert(1, "time", (table["year"] - 1900).astype(float))
    return table.astype({"hare": float, "lynx": float})
