"""The data path: documents -> tokenizer -> sharded token batches.

| module | owns |
|---|---|
| `sources` | a split's documents: embedded (offline), TFDS from a local `data_dir`, text files |
| `python_docs` | the embedded corpus: CPython's documentation, read from the installed stdlib |
| `tokenizer` | the sentencepiece model: trained once, cached, the same bytes on every host |
| `pipeline` | the Grain pipeline: shuffle, tokenize, pack, batch into shards; its iterator state |

Imports are lazy: importing the package pulls in neither Grain nor sentencepiece.
"""
