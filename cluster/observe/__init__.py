"""What a run shows: the observers the driver feeds (TensorBoard, Ray
metrics, workers.json), towerps' log lines, test-accuracy snapshots,
`towerps status` and `towerps compare`'s report. Internal. Imports nothing
itself."""
