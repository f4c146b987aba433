"""The stand-in for a Gaudi on a CPU: eager emulation (:mod:`.eager`: CPU tensors, the ``"hccl"`` process group of
:mod:`.hccl_group`, synchronized batch norm of :mod:`.sync_batchnorm`) and lazy emulation (:mod:`.lazy`: torch's Lazy
Tensor Core). Only the backend seam (:mod:`lightning_gaudi.hpu`) imports it; the plugin asks the backend what it can
do, never whether it is emulated."""
