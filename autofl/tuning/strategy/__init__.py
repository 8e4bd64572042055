"""How a study searches, with no Ray in it: the space file (`space`), the sampler and scheduler
sections (`spec`) and what builds them (`build`), the per-trial-seeded sampler (`trial_sampler`,
`grid_sampler`, `repeats`), the ASHA rule (`asha`), objectives and constraints, and warm start."""
