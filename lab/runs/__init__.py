"""Running the stage notebooks headless, one run or a grid of them.

  pipeline      the one stage runner (papermill), the five notebooks headless and the run's summary
                (`python -m lab demo`, `summary`)
  sweep         sweeps over the notebooks with Hydra's launchers (`python -m lab sweep`)
  jobs          a sweep's folder as files: job.json, the done.json seal, error.txt, finding the jobs
  sweep_report  one table and plots across a sweep's jobs (`python -m lab report`)
  cli           the `sweep` and `report` commands
"""
