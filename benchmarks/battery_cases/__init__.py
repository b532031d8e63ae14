"""The battery's cases (benchmarks/battery.py runs them): valid input in valid_fits and valid_more, bad input in
invalid_fits and invalid_more; each module registers its cases in :data:`common.CASES` when imported."""
