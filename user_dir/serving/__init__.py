"""The pieces of ``fc-serve`` (user_dir/serving/serve.py), each small and testable without a server:

* ``cost_table``: seconds of one batch by plugin ratio k and batch size, measured at start-up;
* ``policy``: which k a batch runs at (``fixed:K``, or ``adaptive`` against a p95 latency target);
* ``batcher``: dynamic batching, one worker thread owning the model, a bounded queue;
* ``backends``: the frozen backbone with its Variator plugins, tokenising as its training data was made
  (a GLUE sentence classifier, or a translation model through fairseq's hub interface).

None of these import the HTTP libraries; serve.py wires them into FastAPI.
"""
