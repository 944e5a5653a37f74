"""The training side of the restore path: launch a training command, report how each attempt
ended (``job.started`` / ``job.failed`` / ``job.succeeded``) and relaunch it from the
restore-coordinator's plan. `adapter` is the scheduler interface (the embedded local one is
`adapter.LocalProcess`), `domain` classifies exits, `runner` drives the attempts."""
