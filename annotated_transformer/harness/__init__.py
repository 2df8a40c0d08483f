"""The harness: what makes training practical around the core's Transformer and loop.

    trainer.py        Trainer (fit / train epoch / validate / save) and train_worker, the entry point
    checkpointer.py   Checkpointer: one run's last.pt, best, epoch and avg files, resuming, across ranks
    resume.py         RunState (all last.pt holds), RunCounters (epochs, clocks, best score), random states, StopSignal
    progress.py       the log lines of a run: its first line, epoch lines with the time left, the slow-run warning
    run_end.py        the end of a run: charts, final scores, example translations, the translate command
    run_dir.py        the run directory: its lock, start mode (start / resume / finished), metrics.jsonl, epoch files
    distributed.py    torchrun set-up, print0, barrier
    tasks.py          Multi30k or the copy task behind one interface
    monitor.py        GPU utilisation and memory samples
    tensorboard_log.py  the metrics as TensorBoard scalars

Nothing is imported here, so `import annotated_transformer.harness.run_dir` loads only what it needs.
"""
