"""The Ray Tune adapter: starting Ray (`ray_start`, `preflight`, `logs`), one Tune experiment of a
study (`experiment`) and which ones a command runs (`runner`), the trainable, the searcher,
scheduler and stoppers on Tune's public hooks, checkpoints, GPU packing, Ctrl-C and the live view."""
