"""The served model: one frozen fairseq backbone with its Variator plugins attached
(user_dir/variator/plugged_encoder.py), switched per batch with ``VariatorPlugins.use(k)``.

Text is turned into token ids the way the model's training data was made, by the code that made it:

* a GLUE sentence classifier: the data folder's ``.prepared.json`` (written by preprocess/prepare_glue.py)
  names the segmentation (WordPiece, Moses, BPE or sentencepiece) and the length the examples were cut
  to; ``prepare_glue.make_tokenizer`` and ``prepare_glue.truncate_examples`` are called here as they were
  there, and fairseq's own dataset classes add the special tokens as ``sentence_prediction`` does;
* a translation model: fairseq's hub interface (``GeneratorHubInterface``: Moses tokenizer and
  subword-nmt BPE, as ``fairseq-interactive`` does with the same flags).

Each backend validates one request's texts (``InputError`` names the example) before anything is
queued, and runs a batch at a given ratio k from the worker thread.
"""
import argparse
import json
import logging
import os
from typing import List, Optional, Sequence

import numpy as np
import torch

logger = logging.getLogger(__name__)


class InputError(ValueError):
    """A request's example that cannot be served; ``index`` is its position in the request's list."""

    def __init__(self, index: int, message: str):
        super().__init__(message)
        self.index = index


def checkpoint_task(path: str) -> str:
    """The fairseq task a checkpoint was trained with (``cfg.task._name``)."""
    from fairseq import checkpoint_utils
    state = checkpoint_utils.load_checkpoint_to_cpu(path)
    cfg = state.get("cfg") or {}
    task = cfg.get("task") if hasattr(cfg, "get") else None
    name = task.get("_name") if task is not None and hasattr(task, "get") else None
    if name is None and state.get("args") is not None:
        name = getattr(state["args"], "task", None)
    if name is None:
        raise ValueError(f"{path}: the checkpoint names no fairseq task")
    return name


def _attach(model, plugins: str) -> List[int]:
    # the parameters keep requires_grad as loaded (every forward here runs under no_grad): switched off, torch's
    # matmul runs a non-contiguous 3-D input through a slower batched matmul (user_dir/common/teacher.py)
    from user_dir.variator.plugged_encoder import attach_plugin_files
    return [0] + attach_plugin_files(model, plugins).ratios


def _random_tokens(dictionary, n: int, generator: torch.Generator) -> torch.Tensor:
    """``n`` ids of ordinary (non-special) dictionary symbols."""
    return torch.randint(dictionary.nspecial, len(dictionary), (n,), generator=generator)


class ClassifierBackend:
    """A fairseq ``sentence_prediction`` checkpoint (e.g. a GLUE teacher of scripts/recipes/glue_teachers.sh)."""
    kind = "classify"

    def __init__(self, checkpoint: str, data: Optional[str] = None, plugins: str = "", head: Optional[str] = None,
                 wordpiece_vocab: Optional[str] = None):
        import user_dir  # noqa: F401  (registers the plug-in: hf_bert, the Variator tasks, checkpoint loading)
        from fairseq import checkpoint_utils

        overrides = {"data": os.path.abspath(data)} if data else {}
        models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides=overrides)
        self.model, self.task, self.cfg = models[0].eval(), task, cfg
        self.ratios = _attach(self.model, plugins)
        self.data = task.cfg.data
        self.dictionary = task.source_dictionary
        heads = list(getattr(self.model, "classification_heads", {}) or {})
        if head is None:
            if len(heads) != 1:
                raise ValueError(f"--head: {checkpoint} has classification heads {heads}; name the one to serve")
            head = heads[0]
        elif head not in heads:
            raise ValueError(f"--head {head}: {checkpoint} has classification heads {heads}")
        self.head = head
        self.regression = bool(getattr(task.cfg, "regression_target", False))
        self.pair = os.path.isdir(os.path.join(self.data, "input1"))
        prepared = self._prepared_config()
        if wordpiece_vocab:
            prepared["wordpiece_vocab"] = wordpiece_vocab
        from preprocess.prepare_glue import make_tokenizer
        from preprocess.textio import DataError
        try:
            self.tokenize = make_tokenizer(argparse.Namespace(**prepared), quiet=True)  # loaded once, no log line
        except DataError as e:
            raise ValueError(f"{self.data}/.prepared.json: its tokenizer cannot be rebuilt here: {e}") from None
        self.tokenize(["warm up"])  # its Moses tables, BPE codes or sentencepiece model: loaded now, once
        self.segmentation = prepared.get("tokenizer")
        self.pair_specials = int(prepared.get("pair_specials", 3))
        positions = self.model.max_positions()
        positions = positions if isinstance(positions, int) else min(p for p in positions if p)
        self.max_length = min(int(prepared.get("max_length") or positions), positions)
        self.labels = self._label_names()

    def _prepared_config(self) -> dict:
        path = os.path.join(self.data, ".prepared.json")
        if not os.path.isfile(path):
            raise ValueError(f"--data {self.data}: no .prepared.json (written by preprocess/prepare_glue.py); the "
                             "server tokenises as that file says the training data was tokenised")
        with open(path, encoding="utf-8") as f:
            return json.load(f)["config"]

    def _label_names(self) -> List[str]:
        if self.regression:
            return []
        path = os.path.join(self.data, "label", "names.txt")
        if not os.path.isfile(path):
            raise ValueError(f"{path}: missing (written by preprocess/prepare_glue.py): needed to name the classes")
        with open(path, encoding="utf-8") as f:
            names = dict(line.rstrip("\n").split("\t", 1) for line in f if line.strip())
        return [names[str(i)] for i in range(len(names))]

    def describe(self) -> dict:
        return {"task": "classify", "inputs": "pairs" if self.pair else "texts", "labels": self.labels,
                "regression": self.regression, "max_length": self.max_length, "segmentation": self.segmentation}

    # ---- a request's examples -> token ids ----------------------------------------------------------------
    def prepare(self, examples: Sequence[Sequence[str]], truncate: bool) -> List[dict]:
        """Token ids of each example (a 1-tuple of text, or a 2-tuple for a pair task), cut to the model's
        length as preprocess/prepare_glue.py cut the training data, or refused when ``truncate`` is False."""
        from preprocess.prepare_glue import truncate_examples
        columns = [self.tokenize([ex[c] for ex in examples]) for c in range(len(examples[0]))]
        specials = self.pair_specials if len(columns) == 2 else 2
        for i in range(len(examples)):
            lengths = [len(col[i].split()) for col in columns]
            if min(lengths) == 0:
                which = "" if len(lengths) == 1 else f" (sentence {lengths.index(0) + 1} of the pair)"
                raise InputError(i, f"no tokens left after {self.segmentation} tokenisation{which}")
            if not truncate and sum(lengths) + specials > self.max_length:
                raise InputError(i, f"{sum(lengths)} tokens + {specials} special tokens, over the model's maximum "
                                    f"{self.max_length}; shorten it, or send \"truncate\": true to cut it as the "
                                    "training data was cut")
        cut_columns, _ = truncate_examples(columns, self.max_length, self.pair_specials)
        tokens = self._assemble(cut_columns)
        return [{"tokens": t, "truncated": [len(c.split()) for c in cut] != [len(c.split()) for c in orig]}
                for t, cut, orig in zip(tokens, zip(*cut_columns), zip(*columns))]

    def _assemble(self, columns: List[List[str]]) -> List[torch.Tensor]:
        """Binarise and add the special tokens with the dataset classes fairseq's ``sentence_prediction``
        task builds in ``load_dataset`` (init token, separator, final cut at the model's positions)."""
        from fairseq.data import ConcatSentencesDataset, ListDataset, PrependTokenDataset
        from fairseq.data.shorten_dataset import maybe_shorten_dataset

        def dataset(lines):
            ids = [self.dictionary.encode_line(line, append_eos=True, add_if_not_exist=False).long() for line in lines]
            return ListDataset(ids, sizes=np.array([len(t) for t in ids]))

        cfg = self.task.cfg
        tokens = dataset(columns[0])
        if cfg.init_token is not None:
            tokens = PrependTokenDataset(tokens, cfg.init_token)
        if len(columns) == 2:
            second = dataset(columns[1])
            if cfg.separator_token is not None:
                second = PrependTokenDataset(second, cfg.separator_token)
            tokens = ConcatSentencesDataset(tokens, second)
        tokens = maybe_shorten_dataset(tokens, "serve", cfg.shorten_data_split_list, cfg.shorten_method,
                                       self.task.max_positions(), cfg.seed)
        return [tokens[i] for i in range(len(columns[0]))]

    @staticmethod
    def size_of(payload: dict) -> int:
        """Tokens of one prepared example (specials included): what its batch is padded to."""
        return payload["tokens"].numel()

    # ---- the worker's side ---------------------------------------------------------------------------------
    def run(self, payloads: List[dict], k: int) -> List[dict]:
        from fairseq.data import data_utils
        self.model.variator.use(k)
        tokens = data_utils.collate_tokens([p["tokens"] for p in payloads], self.dictionary.pad(), left_pad=False)
        lengths = torch.tensor([p["tokens"].numel() for p in payloads])
        with torch.no_grad():
            logits, _ = self.model(tokens, src_lengths=lengths, features_only=True,
                                   classification_head_name=self.head)
        if self.regression:
            return [{"score": float(v), "k": k, "truncated": p["truncated"]}
                    for v, p in zip(logits.view(-1).tolist(), payloads)]
        probs = torch.softmax(logits.float(), dim=-1)
        out = []
        for row, p in zip(probs.tolist(), payloads):
            best = max(range(len(row)), key=row.__getitem__)
            out.append({"label": self.labels[best], "label_index": best,
                        "scores": dict(zip(self.labels, row)), "k": k, "truncated": p["truncated"]})
        return out

    def synthetic(self, size: int, length: int, seed: int = 0) -> List[dict]:
        """``size`` examples of ``length`` tokens (specials included) of random ordinary symbols: the
        start-up timing batches."""
        g = torch.Generator().manual_seed(seed)
        length = max(3, min(length, self.max_length))
        init = self.task.cfg.init_token if self.task.cfg.init_token is not None else self.dictionary.bos()
        return [{"tokens": torch.cat([torch.tensor([init]), _random_tokens(self.dictionary, length - 2, g),
                                      torch.tensor([self.dictionary.eos()])]), "truncated": False}
                for _ in range(size)]


class TranslatorBackend:
    """A fairseq translation checkpoint through fairseq's hub interface (what ``fairseq-interactive`` runs)."""
    kind = "translate"

    def __init__(self, checkpoint: str, data: Optional[str] = None, plugins: str = "",
                 source_lang: Optional[str] = None, target_lang: Optional[str] = None, tokenizer: str = "moses",
                 bpe: str = "subword_nmt", bpe_codes: Optional[str] = None, lowercase: bool = False, beam: int = 5,
                 max_len_a: float = 0, max_len_b: int = 200):
        import user_dir  # noqa: F401
        from fairseq import checkpoint_utils
        from fairseq.hub_utils import GeneratorHubInterface

        data = os.path.abspath(data or os.path.dirname(os.path.abspath(checkpoint)))
        overrides = {"data": data}
        if tokenizer and tokenizer != "none":
            overrides["tokenizer"] = tokenizer
            if tokenizer == "moses":  # as the data was tokenised: sacremoses tokenize(escape=False), no dash splits
                overrides.update(moses_no_escape=True, moses_no_dash_splits=True)
        if bpe and bpe != "none":
            codes = bpe_codes or os.path.join(os.path.dirname(os.path.abspath(checkpoint)), "code")
            if not os.path.isfile(codes):
                raise ValueError(f"--bpe-codes {codes}: no such file (the BPE codes the training data was made with)")
            overrides.update(bpe=bpe, bpe_codes=codes)
        if source_lang:
            overrides["source_lang"] = source_lang
        if target_lang:
            overrides["target_lang"] = target_lang
        models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides=overrides)
        self.hub = GeneratorHubInterface(cfg, task, models).eval()
        self.model = self.hub.models[0]
        self.ratios = _attach(self.model, plugins)
        self.lowercase, self.beam, self.max_len_a, self.max_len_b = lowercase, beam, max_len_a, max_len_b
        self.max_length = self.hub.max_positions[0] if isinstance(self.hub.max_positions, tuple) \
            else self.hub.max_positions
        self.segmentation = f"{tokenizer} + {bpe}"

    def describe(self) -> dict:
        return {"task": "translate", "max_length": self.max_length, "segmentation": self.segmentation,
                "lowercase": self.lowercase, "beam": self.beam}

    def prepare(self, examples: Sequence[Sequence[str]], truncate: bool) -> List[dict]:
        out = []
        for i, (text,) in enumerate(examples):
            tokens = self.hub.encode(text.lower() if self.lowercase else text)
            if tokens.numel() <= 1:  # the end-of-sentence token only
                raise InputError(i, f"no tokens left after {self.segmentation} segmentation")
            truncated = tokens.numel() > self.max_length
            if truncated and not truncate:
                raise InputError(i, f"{tokens.numel()} tokens (end of sentence included), over the model's maximum "
                                    f"{self.max_length}; shorten it, or send \"truncate\": true to keep its first "
                                    f"{self.max_length - 1} tokens")
            if truncated:  # its first tokens and the end-of-sentence token
                tokens = torch.cat([tokens[: self.max_length - 1], tokens[-1:]])
            out.append({"tokens": tokens, "truncated": truncated})
        return out

    @staticmethod
    def size_of(payload: dict) -> int:
        """Source tokens of one prepared sentence (end of sentence included): the encoder's batch is padded to the
        longest, and beam search runs about as long as the source."""
        return payload["tokens"].numel()

    def run(self, payloads: List[dict], k: int) -> List[dict]:
        self.model.variator.use(k)
        with torch.no_grad():
            hypos = self.hub.generate([p["tokens"] for p in payloads], beam=self.beam, max_len_a=self.max_len_a,
                                      max_len_b=self.max_len_b)
        return [{"translation": self.hub.decode(h[0]["tokens"]), "k": k, "truncated": p["truncated"]}
                for h, p in zip(hypos, payloads)]

    def synthetic(self, size: int, length: int, seed: int = 0) -> List[dict]:
        g = torch.Generator().manual_seed(seed)
        length = max(2, min(length, self.max_length))
        eos = torch.tensor([self.hub.src_dict.eos()])
        return [{"tokens": torch.cat([_random_tokens(self.hub.src_dict, length - 1, g), eos]), "truncated": False}
                for _ in range(size)]


def load_backend(checkpoint: str, **kwargs):
    """The backend for ``checkpoint``'s task: sentence prediction -> classify, translation -> translate."""
    if not os.path.isfile(checkpoint):
        raise ValueError(f"checkpoint {checkpoint}: no such file")
    import user_dir  # noqa: F401
    task = checkpoint_task(checkpoint)
    classify = {k: kwargs[k] for k in ("data", "plugins", "head", "wordpiece_vocab") if k in kwargs}
    if "sentence_prediction" in task:
        return ClassifierBackend(checkpoint, **classify)
    if "translation" in task:
        return TranslatorBackend(checkpoint,
                                 **{k: v for k, v in kwargs.items() if k not in ("head", "wordpiece_vocab")})
    raise ValueError(f"checkpoint {checkpoint}: task {task!r}; fc-serve serves sentence_prediction (classify) and "
                     "translation (translate) models")
