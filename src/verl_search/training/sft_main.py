"""verl's SFT trainer (`verl.trainer.sft_trainer.SFTTrainer`) on the CPU, one process.

    python -m torch.distributed.run --standalone --nproc_per_node=1 -m verl_search.training.sft_main OVERRIDES...

with `VERL_USE_EXTERNAL_MODULES=verl_search.cpu.plugin` and `VERL_PLATFORM=cpu`. It does
what `python -m verl.trainer.sft_trainer` does (compose `sft_trainer_engine.yaml` with the
overrides, `auto_set_device`, `SFTTrainer(config).fit()`), with one difference: the process group
is started with the `gloo` backend here. verl's `initialize_global_process_group` asks torch for
`f"cpu:gloo,{device}:{backend}"`, which on the CPU platform is `"cpu:gloo,cpu:gloo"`, and torch
refuses it: `ValueError: Duplicate device type cpu in backend string: gloo`.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Compose verl's SFT config with `argv` (hydra overrides), train, return 0."""
    import torch.distributed
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from verl.trainer.sft_trainer import SFTTrainer
    from verl.utils.device import auto_set_device

    from verl_search.verl_config.compose import verl_config_dir

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=verl_config_dir(), version_base=None):
        config = compose(config_name="sft_trainer_engine", overrides=list(sys.argv[1:] if argv is None else argv))
    auto_set_device(config)
    torch.distributed.init_process_group(backend="gloo")
    try:
        SFTTrainer(config=config).fit()
    finally:
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
