"""The python_docs corpus frozen into files, so a CPU and a GPU train on the same text.

`data.source='python_docs'` reads the docstrings of the *installed* Python and
packages, which differ on another machine's image. This exports them once:

    python -m studies.corpus_export --out .gpu            # about 2 minutes

writes, under `--out`, `verdict_corpus/<n>.txt` (read with `data.source='text'`),
`verdict_tokenizer.model` (a sentencepiece model trained on its train split,
carried, never retrained elsewhere) and `verdict_corpus.json` (the sha256 of
the files, the documents, the train split's tokens).

Document boundaries are kept: the text source cuts each file into paragraph
chunks of at least `DOCUMENT_TARGET_CHARS` characters, so a run of full
python_docs documents ending with one short document (a source file's last
chunk) is written as one file; the source then cuts exactly the same documents.
"""
import argparse
import hashlib
import json
import os

from mecefo_jax.data import python_docs, sources

CORPUS_DIR, TOKENIZER, SUMMARY = 'verdict_corpus', 'verdict_tokenizer.model', 'verdict_corpus.json'
COMMAND = 'python -m studies.corpus_export --out {assets}'


def is_full(document: str) -> bool:
    """Whether the text source closes a chunk at this document's end by itself."""
    return sum(len(p) for p in sources.paragraph_chunks(document, target_chars=1)) >= \
        sources.DOCUMENT_TARGET_CHARS


def file_groups(documents) -> list[list[str]]:
    """`documents` cut into runs that end at a short document (or the corpus's end)."""
    groups, current = [], []
    for document in documents:
        current.append(document)
        if not is_full(document):
            groups.append(current)
            current = []
    return groups + ([current] if current else [])


def corpus_sha256(folder: str) -> str:
    """sha256 over the corpus files in the order the text source reads them (names and bytes)."""
    digest = hashlib.sha256()
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), 'rb') as f:
            digest.update(name.encode() + b'\0' + f.read() + b'\0')
    return digest.hexdigest()


def write_corpus(documents, folder: str) -> int:
    """The documents as files under `folder` (replaced); returns how many files."""
    os.makedirs(folder, exist_ok=True)
    for name in os.listdir(folder):
        os.remove(os.path.join(folder, name))
    groups = file_groups(documents)
    for index, group in enumerate(groups):
        with open(os.path.join(folder, f'{index:06d}.txt'), 'w', encoding='utf-8') as f:
            f.write('\n\n'.join(group) + '\n')
    return len(groups)


def text_data(assets: str) -> dict:
    """The data overrides that read the exported corpus from `assets`."""
    return {'data.source': 'text', 'data.text_files': os.path.join(assets, CORPUS_DIR, '*.txt'),
            'data.tokenizer_path': os.path.join(assets, TOKENIZER)}


def export(documents, out: str, vocab_size: int, *, val_fraction: float = 0.05) -> dict:
    """Write the corpus and its tokenizer under `out`; check the text source reads back
    `documents` exactly; return (and write) the summary."""
    from mecefo_jax.config.defaults import DataSection
    from mecefo_jax.data import tokenizer as tok
    files = write_corpus(documents, os.path.join(out, CORPUS_DIR))
    overrides = {k.split('.')[1]: v for k, v in text_data(out).items()}
    defaults = {'tfds_name': '', 'data_dir': '', 'tfds_text_key': 'text', 'cache_dir': '',
                'seq_len': 1, 'global_batch_size': 1, 'val_fraction': val_fraction, 'seed': 0}
    data = DataSection(**{**defaults, **overrides})
    read = [d for split in sources.SPLITS for d in sources.load_documents(data, split)]
    if sorted(read) != sorted(documents):
        raise RuntimeError(f'{out}/{CORPUS_DIR} does not read back as the exported documents.')
    train = sources.load_documents(data, 'train')
    with open(os.path.join(out, TOKENIZER), 'wb') as f:
        f.write(tok.train_sentencepiece(train, vocab_size))
    tokenizer = tok.Tokenizer.from_file(os.path.join(out, TOKENIZER))
    summary = {'sha256': corpus_sha256(os.path.join(out, CORPUS_DIR)), 'files': files,
               'documents': len(documents), 'chars': sum(map(len, documents)),
               'vocab_size': vocab_size, 'val_fraction': val_fraction,
               'train_tokens': sum(len(tokenizer.encode(d)) + 1 for d in train),  # + EOS each
               'command': COMMAND.format(assets=out)}
    with open(os.path.join(out, SUMMARY), 'w') as f:
        json.dump(summary, f, indent=1)
    return summary


def read_summary(assets: str) -> dict:
    """The export's summary; a clear error naming the file and the command where it is missing
    or its corpus files changed since."""
    path = os.path.join(assets, SUMMARY)
    if not os.path.exists(path):
        raise FileNotFoundError(f'{path} is missing: the verdict corpus is exported once, on CPU, '
                                f'with `{COMMAND.format(assets=assets)}` (then carry {assets}/).')
    with open(path) as f:
        summary = json.load(f)
    folder = os.path.join(assets, CORPUS_DIR)
    if not os.path.isdir(folder) or corpus_sha256(folder) != summary['sha256']:
        raise ValueError(f'{folder} is not the corpus {path} records (sha256 {summary["sha256"]}); '
                         f'export it again: `{COMMAND.format(assets=assets)}`.')
    return summary


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--out', default='.gpu', help='the assets folder (default .gpu)')
    parser.add_argument('--vocab_size', type=int, default=32000, help="configs/llama_60m.py's")
    parser.add_argument('--roots', default='', help='comma list of folders to read instead of '
                        "python_docs' own (the standard library and PACKAGES): a small corpus")
    args = parser.parse_args()
    roots = [r for r in args.roots.split(',') if r] or python_docs.source_roots()
    documents = python_docs.corpus_texts(roots, sources.paragraph_chunks)
    summary = export(documents, args.out, args.vocab_size)
    print(json.dumps(summary, indent=1))


if __name__ == '__main__':
    main()
