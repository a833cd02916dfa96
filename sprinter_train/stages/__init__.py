"""One module per stage, each exposing run(cfg) -> dict of metrics; the registry is the CLI."""

# stage name -> module with run(cfg)
STAGES: dict[str, str] = {
    "harvest": "sprinter_train.stages.harvest",
    "train": "sprinter_train.stages.train",
    "tables": "sprinter_train.stages.tables",
    "evaluate": "sprinter_train.stages.evaluate",
    "bench": "sprinter_train.stages.bench",
    "distill": "sprinter_train.stages.distill",
    "draft_eval": "sprinter_train.stages.draft_eval",
    "export": "sprinter_train.stages.export",
    "all": "sprinter_train.stages.all",
}
