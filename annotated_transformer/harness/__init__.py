"""The harness: what makes training practical around the core's Transformer and loop.

    trainer.py        Trainer (fit / train epoch / evaluate / save) and train_worker, the entry point
    checkpointing.py  checkpoint files, the background writer, averaging, Checkpointer
    resume.py         RunState (everything last.pt holds), random states, StopSignal
    report.py         the log lines of a run (time left, the slow-run warning) and its end: charts, scores
    run_dir.py        the run directory: its lock, plan (start / resume / finished), metrics.jsonl, epoch files
    distributed.py    torchrun set-up, print0, barrier
    tasks.py          Multi30k or the copy task behind one interface
    monitor.py        GPU utilisation and memory samples
    tensorboard_log.py  the metrics as TensorBoard scalars

Nothing is imported here, so `import annotated_transformer.harness.run_dir` loads only what it needs.
"""
