"""Example ODE systems and their published experiment set-ups (TOML files, loaded by pgpgm.load_model)."""
