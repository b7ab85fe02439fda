"""A run's model as a Hugging Face LlamaForCausalLM directory: config.json, model.safetensors, its tokenizer.

  python scripts/hf_export.py --workdir runs/tiny --out runs/tiny/hf
  python scripts/hf_export.py --workdir /nfs/runs/1b --out /nfs/hf/1b --source=memory --address=head:6379

From the newest Orbax checkpoint (--source=disk), or from the in-memory snapshots of a
launcher job's live keepers (--source=memory); --step picks another. The directory loads
with transformers (LlamaForCausalLM, LlamaTokenizer) and starts a run with
--config.train.init_from=DIR (docs/usage.md, "Hugging Face checkpoints").
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags, logging  # noqa: E402

_WORKDIR = flags.DEFINE_string('workdir', None, "The run's workdir (its config.json and checkpoints).")
_OUT = flags.DEFINE_string('out', None, 'The Hugging Face directory to write.')
_SOURCE = flags.DEFINE_enum('source', 'disk', ['disk', 'memory'], "Orbax checkpoint, or the job's keepers.")
_STEP = flags.DEFINE_integer('step', None, 'The step to export (default: the newest held).')
_TOKENIZER = flags.DEFINE_string('tokenizer', None, "The run's sentencepiece model, where its cache is elsewhere.")
_ADDRESS = flags.DEFINE_string('address', None, "--source=memory: the job's Ray cluster (default: its local one).")
flags.mark_flags_as_required(['workdir', 'out'])


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # Orbax's INFO lines would bury the result
    from mecefo_jax.training.export import export_run
    snapshots = None
    if _SOURCE.value == 'memory':
        from mecefo_jax.launch.keepers import job_snapshots
        snapshots = job_snapshots(_WORKDIR.value, _ADDRESS.value)
        if not snapshots:
            sys.exit(f'hf_export: no live keeper of the job in {_WORKDIR.value} holds a snapshot; '
                     'export its Orbax checkpoint with --source=disk.')
    try:
        print(json.dumps(export_run(_WORKDIR.value, _OUT.value, snapshots=snapshots, step=_STEP.value,
                                    tokenizer=_TOKENIZER.value), indent=2))
    finally:
        for snapshot in snapshots or ():
            snapshot.close()


if __name__ == '__main__':
    app.run(main)
