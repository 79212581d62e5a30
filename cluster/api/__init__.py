"""towerps' public API: what a user imports and runs.

    towerps.fit(build_model, train=(x, y), ...)   fit.py: your own Keras model
    TrainConfig(...), towerps.train(config)        config.py, the built-in runs
    RunSummary.load("runs/x/summary.json")         summary.py: summary.json
    towerps train --config job.yaml                cli.py, flags.py (made from TrainConfig), jobfile.py

Names here keep a deprecation path when they change; everything else under
`towerps.cluster` is internal. Modules load on first use (see
`towerps.cluster`), so this package imports nothing itself.
"""
