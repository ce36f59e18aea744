"""What the PyTRIO and Tinker adapters share: clients over a remote training service.

Both services speak the Tinker-shaped API of :mod:`retool.types`, so one set
of client classes serves both; :mod:`retool.backends.pytrio` and
:mod:`retool.backends.tinker` subclass them with the few SDK calls and type
conversions that differ (each cites the installed SDK file it follows).

One module per job, each with its design in its docstring:

* :mod:`~retool.backends.remote.futures`: SDK futures bridged into ours,
  SDK errors translated into one-line :class:`~retool.errors.BackendError` errors;
* :mod:`~retool.backends.remote.losses`: what a ``forward`` /
  ``forward_backward`` call sends (only the loss's keys, scaled for the
  service's loss reduction), the limits checked before it is sent, and the
  metrics made from what comes back, under the local backend's names;
* :mod:`~retool.backends.remote.samples`: sampled sequences, stop reasons,
  stop lists and tensors converted between the SDKs' types and ours;
* :mod:`~retool.backends.remote.checkpoints`: the pointer directories a
  checkpoint kept by the service gets in the run directory;
* :mod:`~retool.backends.remote.clients`: the sampling, training and service
  client classes the adapters subclass.

Common to all of them:

* **No retry layer** is added: both SDKs retry transport errors themselves,
  and what is left is the rollout's ``sampler_error`` path.
* **Limits** the service imposes and the SDK states (LoRA rank range,
  checkpoint names, the model's longest sequence) are checked before the
  request that would break them, with an error that says what to change.
* **Credentials** are the SDKs' own (environment variable or the SDK's login
  command); they are checked for presence before any request and never read
  into, stored or logged by our code.
* **Order.** Both SDKs run one training client's requests in the order they
  were submitted (Tinker: ``_take_turn`` in tinker/lib/public_interfaces/
  training_client.py; PyTRIO: "later events remain ordered by the same
  coordinator", pytrio/client/training.py), so a caller may submit an
  update's ``forward_backward`` calls and its ``optim_step`` before waiting
  on any of them (:meth:`retool.training.session.Session.update`).
"""
