"""The jobs behind the commands: pre-training (`pretrain`), fine-tuning (`finetune`) and prediction
(`predict`); their settings (`config`, which the `kgpt-train` flags are defined from), the skeleton
the two training jobs share (`run`), and the run directory they write to (`rundir`).
"""
