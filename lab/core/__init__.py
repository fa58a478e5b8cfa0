"""Plumbing every other package stands on; imports nothing of the lab above it.

  config    compose the Hydra config from conf/ onto the schema and validate it before anything is touched;
            load_saved reads a stage's config.yaml back
  schema    one dataclass per config group: every key's type, help and range, the cross-key rules, the
            competition's fixed limits (`competition`); `python -m lab schema`
  paths     where things are: the project root, the competition's data file, the Kaggle mount, the model folder
  io        atomic writes (a reader never sees half a file); only the main process writes under a launcher
  run       a run and its stages: `Stage`, stage folders, the manifest, the run lock, seeding, report_to
  lineage   content hashes of what a stage read and wrote, and whether a finished stage is still current
  cache     content-keyed caches: a sealed file under its key's digest, or a keyed log of JSON lines
  console   progress lines for training and generation; known library warnings said once
  env       every change the lab makes to the process environment (`setenv`, `scoped`)
  stats     the Wilson interval on a share
  plots     every plot of the lab in one style (functions that take a table and return a Figure), the PNG writer
"""
