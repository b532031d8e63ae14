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


def _read(name: str) -> pd.DataFrame:
    with resources.files("pgpgm.models").joinpath(name).open() as f:
        return pd.read_csv(f, comment="#")


def theophylline() -> pd.DataFrame:
    """Theophylline serum concentrations of 12 subjects after one oral dose (R's ``datasets::Theoph``).

    Source: Boeckmann, Sheiner and Beal (1994), NONMEM Users Guide Part V; Pinheiro and Bates (2000),
    Mixed-Effects Models in S and S-PLUS, Appendix A.29. Part of R (GPL-2 | GPL-3). Doses and
    weights: :func:`theophylline_inputs`.

    Returns
    -------
    pandas.DataFrame
        132 rows in tidy long form: ``experiment`` (subject number as a string, "1".."12"),
        ``time`` (h after the dose), ``state`` ("C") and ``value`` (mg/L).
    """
    table = _read("theophylline.csv")
    return table.astype({"experiment": str, "time": float, "value": float})


def theophylline_inputs() -> pd.DataFrame:
    """Per-subject known inputs of :func:`theophylline`.

    Returns
    -------
    pandas.DataFrame
        12 rows: ``experiment`` (as in :func:`theophylline`), ``dose_mg_per_kg`` (R's ``Dose``),
        ``weight_kg`` (R's ``Wt``) and ``dose_mg`` (their product).
    """
    return _read("theophylline_inputs.csv").astype({"experiment": str})


def influenza_boarding_school() -> pd.DataFrame:
    """Influenza in an English boarding school, 1978: 763 boys, daily number confined to bed.

    Source: R package ``outbreaks`` (MIT), ``influenza_england_1978_school``; Anonymous (1978),
    Influenza in a boarding school, BMJ 1:578.

    Returns
    -------
    pandas.DataFrame
        14 rows: ``date`` (1978-01-22 .. 1978-02-04, datetime64), ``time`` (days since 1978-01-21,
        1.0 .. 14.0), ``in_bed`` and ``convalescent`` (counts, int).
    """
    table = _read("influenza_boarding_school_1978.csv")
    table["date"] = pd.to_datetime(table["date"])
    table.insert(1, "time", (table["date"] - pd.Timestamp("1978-01-21")).dt.days.astype(float))
    return table.astype({"in_bed": int, "convalescent": int})
