"""SUNDIALS functions and pgpgm's C callbacks as link-time symbols, so compiled code is cacheable.

numba refuses to cache (or, worse, would cache wrong) code that embeds a process-specific
address: a ctypes function, a callback address, a counter's address. Here every such
address is a *symbol* resolved when the compiled code is linked into the process:

* the SUNDIALS functions are declared as ``numba.types.ExternalFunction`` by their C names,
  resolved in the libraries that :func:`link_sundials` loads into LLVM's symbol table;
* pgpgm's own per-process addresses (the C callbacks of a system, an integrator's solve
  counter) are registered under a name with :func:`register_symbol`, and compiled code
  reads them with :func:`symbol_address`.

numba's on-disk cache (``cache=True``) then holds code that is valid in any process that
registered the same names, which is what lets PyTensor cache the compiled ODE Op too.
"""

from __future__ import annotations

from functools import cache

import llvmlite.binding as llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from . import sundials

_a, _i32, _f64, _dp = types.int64, types.int32, types.float64, types.CPointer(types.float64)

#: SUNDIALS functions with every pointer argument an address (int64), as in :mod:`.cvode`.
SUNContext_Create = types.ExternalFunction("SUNContext_Create", _i32(_i32, _a))
SUNContext_ClearErrHandlers = types.ExternalFunction("SUNContext_ClearErrHandlers", _i32(_a))
SUNContext_Free = types.ExternalFunction("SUNContext_Free", _i32(_a))
N_VNew_Serial = types.ExternalFunction("N_VNew_Serial", _a(_a, _a))
N_VGetArrayPointer = types.ExternalFunction("N_VGetArrayPointer", _dp(_a))
N_VGetLength = types.ExternalFunction("N_VGetLength", _a(_a))
N_VDestroy = types.ExternalFunction("N_VDestroy", types.void(_a))
SUNDenseMatrix = types.ExternalFunction("SUNDenseMatrix", _a(_a, _a, _a))
SUNDenseMatrix_Data = types.ExternalFunction("SUNDenseMatrix_Data", _dp(_a))
SUNMatDestroy = types.ExternalFunction("SUNMatDestroy", types.void(_a))
SUNLinSol_Dense = types.ExternalFunction("SUNLinSol_Dense", _a(_a, _a, _a))
SUNBandMatrix = types.ExternalFunction("SUNBandMatrix", _a(_a, _a, _a, _a))
SUNBandMatrix_Data = types.ExternalFunction("SUNBandMatrix_Data", _dp(_a))
SUNBandMatrix_LDim = types.ExternalFunction("SUNBandMatrix_LDim", _a(_a))
SUNBandMatrix_StoredUpperBandwidth = types.ExternalFunction("SUNBandMatrix_StoredUpperBandwidth", _a(_a))
SUNLinSol_Band = types.ExternalFunction("SUNLinSol_Band", _a(_a, _a, _a))
SUNLinSolFree = types.ExternalFunction("SUNLinSolFree", _i32(_a))
CVodeCreate = types.ExternalFunction("CVodeCreate", _a(_i32, _a))
CVodeInit = types.ExternalFunction("CVodeInit", _i32(_a, _a, _f64, _a))
CVodeReInit = types.ExternalFunction("CVodeReInit", _i32(_a, _f64, _a))
CVodeSStolerances = types.ExternalFunction("CVodeSStolerances", _i32(_a, _f64, _f64))
CVodeSetUserData = types.ExternalFunction("CVodeSetUserData", _i32(_a, _a))
CVodeSetLinearSolver = types.ExternalFunction("CVodeSetLinearSolver", _i32(_a, _a, _a))
CVodeSetJacFn = types.ExternalFunction("CVodeSetJacFn", _i32(_a, _a))
CVodeSetMaxNumSteps = types.ExternalFunction("CVodeSetMaxNumSteps", _i32(_a, types.long_))
CVodeSetMaxHnilWarns = types.ExternalFunction("CVodeSetMaxHnilWarns", _i32(_a, _i32))
CVodeSetStopTime = types.ExternalFunction("CVodeSetStopTime", _i32(_a, _f64))
CVodeSetMinStep = types.ExternalFunction("CVodeSetMinStep", _i32(_a, _f64))
CVode = types.ExternalFunction("CVode", _i32(_a, _f64, _a, _a, _i32))
CVodeFree = types.ExternalFunction("CVodeFree", types.void(_a))


@cache
def link_sundials() -> bool:
    """Make the SUNDIALS functions resolvable by compiled code (once per process); False
    when no usable SUNDIALS was found (:func:`pgpgm.solve.sundials.status` says why)."""
    if sundials.library() is None:
        return False
    for handle in sundials.load()[2]:
        llvm.load_library_permanently(handle._name)
    return True


def register_symbol(name: str, address: int) -> None:
    """Let compiled code find ``address`` (a C function or a buffer) as :func:`symbol_address`
    ``(name)``. A name registered again points at the new address for code linked afterwards."""
    llvm.add_symbol(name, int(address))


@intrinsic(prefer_literal=True)
def symbol_address(typingctx, name):
    """The address (int64) registered under the literal string ``name`` (:func:`register_symbol`)."""
    if not isinstance(name, types.StringLiteral):
        return None
    symbol = name.literal_value

    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []), symbol)
        return builder.ptrtoint(fn, ir.IntType(64))

    return types.int64(name), codegen
