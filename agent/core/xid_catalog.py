"""NVIDIA's Xid catalogue, every code, with the action and severity nodewarden reports for it.

Source: NVIDIA, "Analyzing Xid Errors with the Xid Catalog" (Ampere and newer GPUs),
https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, and the spreadsheet it links,
https://docs.nvidia.com/Xid-Catalog.xlsx (sheets "Xids", "XID 144-150 Decode", "Fault Resolution Buckets").
Version transcribed: the page as read on 2026-12-01. The page carries no revision date of its own;
that version's rows end at Xid 172 (UNCORRECTABLE_SRAM_ERROR), its newest "introduced" driver is
R575 (CUDA 12.9), and its NVLink5 decode has the V1 (< R575) and V2 (>= R575) IntrInfo layouts.
When NVIDIA adds codes, add rows here; `tests/unit/checks/test_xid.py` proves the table has no gap.

Columns of `_XIDS`: code | mnemonic | NVIDIA's "Resolution Bucket (Immediate Action)", verbatim
("-" where the catalogue leaves it empty or gives prose) | nodewarden's action | severity | what it is.

How a bucket becomes an action and a severity (`reason` below names each exception):

* IGNORE -> `ignore`, info; RESTART_APP -> `restart_app`, info when NVIDIA's investigatory action
  blames the application (CHECK_APP/CUDA, WORKFLOW_XID_13/31), warning when it points past it
  (CONTACT_SUPPORT, INVESTIGATE_SW). Neither ever fails an audit (checks/gpu_xid.py).
* RESET_GPU -> `reset_gpu`, critical. RESTART_BM (Xid 79) -> `drain`, critical: the node must be
  emptied before the bare-metal restart NVIDIA asks for (and `gpu.lost` says the same).
* CHECK_MECHANICALS -> `check_mechanicals`, UPDATE_SWFW -> `update_firmware`, critical.
* CONTACT_SUPPORT (codes the catalogue marks "Unused" on Ampere and later, and 142) -> warning.
* Workflows: WORKFLOW_XID_45 -> ignore (it follows another Xid); WORKFLOW_XID_48 -> reset_gpu, or
  `drain` (DRAIN_AND_RESET) when Xid 63/64 accompany it on the GPU; WORKFLOW_NVLINK_ERR (74) ->
  reset_gpu; XID_154 -> the recovery action its text names; WORKFLOW_NVLINK5_ERR (144-150) ->
  decoded per sub-code from the text (`_NVLINK5` below).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import NamedTuple

from agent.core.lazyre import lazy_compile
from agent.core.model import Severity

# --- the text of an NVLink5 Xid (the catalogue reads its sub-code from it) ------------------------------

class NvLink5Fields(NamedTuple):
    """The fields of an NVLink5 Xid's text (R565+): `<unit> <Fatal|Nonfatal> XC<n> i<n> Link <n> (<regs>)`."""

    unit: str  # as printed: "RLW_REMAP", "NETIR_LINK_EVT", "MSE degraded"
    fatal: bool  # the driver's own word
    cross_contained: bool
    injected: bool
    link: int
    intr_info: int | None  # first register
    error_status: int | None  # second register


# RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)
_NVLINK5_RE = lazy_compile(r"(?P<unit>[A-Za-z][A-Za-z0-9_/]*(?: [Dd]egraded)?)\s+"
                           r"(?P<word>Fatal|Nonfatal|Non-fatal)\s+"
                           r"XC(?P<xc>\d+)\s+i(?P<inj>\d+)\s+Link\s+(?P<link>-?\d+)(?:\s*\((?P<regs>[^)]*)\))?")
_HEX_RE = lazy_compile(r"0x([0-9a-fA-F]+)")


def parse_nvlink5(message: str) -> NvLink5Fields | None:
    """The sub-code fields of an NVLink5 Xid's text; None where the text has another shape."""
    match = _NVLINK5_RE().search(message)
    if not match:
        return None
    regs = [int(value, 16) for value in _HEX_RE().findall(match["regs"] or "")]
    return NvLink5Fields(unit=match["unit"], fatal=match["word"] == "Fatal", cross_contained=match["xc"] != "0",
                         injected=match["inj"] != "0", link=int(match["link"]),
                         intr_info=regs[0] if regs else None, error_status=regs[1] if len(regs) > 1 else None)


ACTIONS = ("ignore", "restart_app", "reset_gpu", "reboot", "drain", "check_mechanicals", "update_firmware",
           "contact_support")
APPLICATION_ACTIONS = frozenset({"ignore", "restart_app"})  # a fault of a program: never fails an audit
ACTION_RANK = {"ignore": 0, "restart_app": 1, "contact_support": 2, "update_firmware": 3, "check_mechanicals": 4,
               "reset_gpu": 5, "drain": 6, "reboot": 7}
SEVERITY_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}
NVLINK5 = range(144, 151)


class Entry(NamedTuple):
    code: int
    mnemonic: str
    bucket: str  # NVIDIA's immediate-action bucket, verbatim; "-" where the catalogue gives none
    action: str
    severity: Severity
    description: str


class Verdict(NamedTuple):
    """What one Xid (or one group of the same Xid) asks of the operator."""

    description: str
    severity: Severity
    action: str
    bucket: str = "-"  # the catalogue bucket (or decode row) the verdict came from


# code | mnemonic | NVIDIA immediate action | action | severity | description
_XIDS = """
1 | ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
2 | ROBUST_CHANNEL_FIFO_ERROR_SW_METHOD | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
3 | ROBUST_CHANNEL_FIFO_ERROR_UNK_METHOD | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
4 | ROBUST_CHANNEL_FIFO_ERROR_CHANNEL_BUSY | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
5 | ROBUST_CHANNEL_FIFO_ERROR_RUNOUT_OVERFLOW | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
6 | ROBUST_CHANNEL_FIFO_ERROR_PARSE_ERR | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
7 | ROBUST_CHANNEL_FIFO_ERROR_PTE_ERR | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
8 | ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT | RESTART_APP | restart_app | warning | GPU stopped processing
9 | ROBUST_CHANNEL_GR_ERROR_INSTANCE | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
10 | ROBUST_CHANNEL_GR_ERROR_SINGLE_STEP | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
11 | ROBUST_CHANNEL_GR_ERROR_MISSING_HW | RESTART_APP | restart_app | info | invalid or corrupted push buffer stream
12 | ROBUST_CHANNEL_GR_ERROR_SW_METHOD | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
13 | ROBUST_CHANNEL_GR_EXCEPTION | RESTART_APP | restart_app | info | graphics engine exception (application fault)
14 | ROBUST_CHANNEL_FAKE_ERROR | IGNORE | ignore | info | fake or injected error from user space
15 | ROBUST_CHANNEL_SCANLINE_TIMEOUT | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
16 | ROBUST_CHANNEL_VBLANK_CALLBACK_TIMEOUT | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
17 | ROBUST_CHANNEL_PARAMETER_ERROR | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
18 | ROBUST_CHANNEL_BUS_MASTER_TIMEOUT_ERROR | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
19 | ROBUST_CHANNEL_DISP_MISSED_NOTIFIER | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
20 | ROBUST_CHANNEL_MPEG_ERROR_SW_METHOD | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
21 | ROBUST_CHANNEL_ME_ERROR_SW_METHOD | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
22 | ROBUST_CHANNEL_VP_ERROR_SW_METHOD | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
23 | ROBUST_CHANNEL_RC_LOGGING_ENABLED | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
24 | ROBUST_CHANNEL_GR_SEMAPHORE_TIMEOUT | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
25 | ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY | RESTART_APP | restart_app | info | invalid or illegal push buffer stream
26 | ROBUST_CHANNEL_FIFO_ERROR_FBISTATE_TIMEOUT | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
27 | ROBUST_CHANNEL_VP_ERROR | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
28 | ROBUST_CHANNEL_VP2_ERROR | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
29 | ROBUST_CHANNEL_BSP_ERROR | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
30 | ROBUST_CHANNEL_BAD_ADDR_ACCESS | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
31 | ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT | RESTART_APP | restart_app | info | GPU memory page fault (application)
32 | ROBUST_CHANNEL_PBDMA_ERROR | RESTART_APP | restart_app | warning | corrupted push buffer stream (PCIe quality)
33 | ROBUST_CHANNEL_SEC_ERROR | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
34 | ROBUST_CHANNEL_MSVLD_ERROR | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
35 | ROBUST_CHANNEL_MSPDEC_ERROR | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
36 | ROBUST_CHANNEL_MSPPP_ERROR | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
37 | ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD | IGNORE | ignore | info | driver firmware error
38 | ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT | IGNORE | ignore | info | driver firmware error (watchdog)
39 | ROBUST_CHANNEL_CE0_ERROR | RESTART_APP | restart_app | warning | copy engine exception (CE0)
40 | ROBUST_CHANNEL_CE1_ERROR | RESTART_APP | restart_app | warning | copy engine exception (CE1)
41 | ROBUST_CHANNEL_CE2_ERROR | RESTART_APP | restart_app | warning | copy engine exception (CE2)
42 | ROBUST_CHANNEL_VIC_ERROR | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
43 | ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR | IGNORE | ignore | info | GPU stopped a channel (application fault)
44 | ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW | IGNORE | ignore | info | graphics engine fault during context switch
45 | ROBUST_CHANNEL_PREEMPTIVE_REMOVAL | WORKFLOW_XID_45 | ignore | info | preemptive cleanup (follows another error)
46 | ROBUST_CHANNEL_GPU_TIMEOUT_ERROR | RESET_GPU | reset_gpu | critical | GPU stopped processing (timeout)
47 | ROBUST_CHANNEL_NVENC0_ERROR | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
48 | ROBUST_CHANNEL_GPU_ECC_DBE | WORKFLOW_XID_48 | reset_gpu | critical | double-bit ECC error (DBE)
49 | SILENT_RUNNING_CONSTANT_LEVEL_SET_BY_REGISTRY | CONTACT_SUPPORT | contact_support | warning | unused
50 | SILENT_RUNNING_LEVEL_TRANSITION_DUE_TO_RC_ERROR | CONTACT_SUPPORT | contact_support | warning | unused
51 | SILENT_RUNNING_STRESS_TEST_FAILURE | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
52 | SILENT_RUNNING_LEVEL_TRANS_DUE_TO_TEMP_RISE | CONTACT_SUPPORT | contact_support | warning | unused
53 | SILENT_RUNNING_TEMP_REDUCED_CLOCKING | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
54 | SILENT_RUNNING_PWR_REDUCED_CLOCKING | CHECK_MECHANICALS | check_mechanicals | critical | aux power not connected
55 | SILENT_RUNNING_TEMPERATURE_READ_ERROR | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
56 | DISPLAY_CHANNEL_EXCEPTION | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
57 | FB_LINK_TRAINING_FAILURE_ERROR | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
58 | FB_MEMORY_ERROR | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
59 | PMU_ERROR | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
60 | ROBUST_CHANNEL_SEC2_ERROR | RESTART_APP | restart_app | warning | video processor exception (SEC2)
61 | PMU_BREAKPOINT | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
62 | PMU_HALT_ERROR | RESET_GPU | reset_gpu | critical | internal micro-controller halt
63 | INFOROM_DRAM_RETIREMENT_EVENT | IGNORE | ignore | info | row remapping event (gpu.row_remap: reset pending?)
64 | INFOROM_DRAM_RETIREMENT_FAILURE | RESET_GPU | reset_gpu | critical | row remapping failure
65 | ROBUST_CHANNEL_NVENC1_ERROR | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
66 | ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION | IGNORE | ignore | info | illegal access by driver
67 | ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION | IGNORE | ignore | info | illegal access by driver
68 | ROBUST_CHANNEL_NVDEC0_ERROR | RESTART_APP | restart_app | warning | video decoder exception (NVDEC0)
69 | ROBUST_CHANNEL_GR_CLASS_ERROR | RESTART_APP | restart_app | info | graphics engine class error
70 | ROBUST_CHANNEL_CE3_ERROR | RESTART_APP | restart_app | warning | copy engine error (CE3)
71 | ROBUST_CHANNEL_CE4_ERROR | RESTART_APP | restart_app | warning | copy engine error (CE4)
72 | ROBUST_CHANNEL_CE5_ERROR | RESTART_APP | restart_app | warning | copy engine error (CE5)
73 | ROBUST_CHANNEL_NVENC2_ERROR | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
74 | NVLINK_ERROR | WORKFLOW_NVLINK_ERR | reset_gpu | critical | NVLink error
75 | ROBUST_CHANNEL_CE6_ERROR | RESTART_APP | restart_app | warning | copy engine error (CE6)
76 | ROBUST_CHANNEL_CE7_ERROR | RESTART_APP | restart_app | warning | copy engine error (CE7)
77 | ROBUST_CHANNEL_CE8_ERROR | RESTART_APP | restart_app | warning | copy engine error (CE8)
78 | VGPU_START_ERROR | UPDATE_SWFW | update_firmware | critical | vGPU start error (update driver and firmware)
79 | ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS | RESTART_BM | drain | critical | GPU has fallen off the bus
80 | PBDMA_PUSHBUFFER_CRC_MISMATCH | RESTART_APP | restart_app | info | corrupted data sent to GPU
81 | ROBUST_CHANNEL_VGA_SUBSYSTEM_ERROR | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
82 | ROBUST_CHANNEL_NVJPG0_ERROR | RESTART_APP | restart_app | warning | JPEG engine error (NVJPG0)
83 | ROBUST_CHANNEL_NVDEC1_ERROR | RESTART_APP | restart_app | warning | video decoder error (NVDEC1)
84 | ROBUST_CHANNEL_NVDEC2_ERROR | RESTART_APP | restart_app | warning | video decoder error (NVDEC2)
85 | ROBUST_CHANNEL_CE9_ERROR | RESTART_APP | restart_app | warning | copy engine error (CE9)
86 | ROBUST_CHANNEL_OFA0_ERROR | RESTART_APP | restart_app | warning | optical flow accelerator exception (OFA0)
87 | NVTELEMETRY_DRIVER_REPORT | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
88 | ROBUST_CHANNEL_NVDEC3_ERROR | RESTART_APP | restart_app | warning | video decoder error (NVDEC3)
89 | ROBUST_CHANNEL_NVDEC4_ERROR | RESTART_APP | restart_app | warning | video decoder error (NVDEC4)
90 | LTC_ERROR | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
91 | RESERVED_XID | CONTACT_SUPPORT | contact_support | warning | unused (reserved)
92 | EXCESSIVE_SBE_INTERRUPTS | IGNORE | ignore | warning | high single-bit ECC error rate
93 | INFOROM_ERASE_LIMIT_EXCEEDED | IGNORE | ignore | info | provisioned InfoROM wear limit reached (nvflash)
94 | ROBUST_CHANNEL_CONTAINED_ERROR | RESTART_APP | restart_app | warning | contained memory error (reset at leisure)
95 | ROBUST_CHANNEL_UNCONTAINED_ERROR | RESET_GPU | reset_gpu | critical | uncontained memory error
96 | ROBUST_CHANNEL_NVDEC5_ERROR | RESTART_APP | restart_app | warning | video decoder error (NVDEC5)
97 | ROBUST_CHANNEL_NVDEC6_ERROR | RESTART_APP | restart_app | warning | video decoder error (NVDEC6)
98 | ROBUST_CHANNEL_NVDEC7_ERROR | RESTART_APP | restart_app | warning | video decoder error (NVDEC7)
99 | ROBUST_CHANNEL_NVJPG1_ERROR | RESTART_APP | restart_app | warning | JPEG engine error (NVJPG1)
100 | ROBUST_CHANNEL_NVJPG2_ERROR | RESTART_APP | restart_app | warning | JPEG engine error (NVJPG2)
101 | ROBUST_CHANNEL_NVJPG3_ERROR | RESTART_APP | restart_app | warning | JPEG engine error (NVJPG3)
102 | ROBUST_CHANNEL_NVJPG4_ERROR | RESTART_APP | restart_app | warning | JPEG engine error (NVJPG4)
103 | ROBUST_CHANNEL_NVJPG5_ERROR | RESTART_APP | restart_app | warning | JPEG engine error (NVJPG5)
104 | ROBUST_CHANNEL_NVJPG6_ERROR | RESTART_APP | restart_app | warning | JPEG engine error (NVJPG6)
105 | ROBUST_CHANNEL_NVJPG7_ERROR | RESTART_APP | restart_app | warning | JPEG engine error (NVJPG7)
106 | SMBPBI_TEST_MESSAGE | IGNORE | ignore | info | SMBPBI test message
107 | SMBPBI_TEST_MESSAGE_SILENT | IGNORE | ignore | info | SMBPBI test message (silent)
108 | NVLINK_REMOTE_TRANSLATION_ERROR | IGNORE | ignore | info | unused (remote translation error)
109 | ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR | RESET_GPU | reset_gpu | critical | context switch timeout
110 | SEC_FAULT_ERROR | RESET_GPU | reset_gpu | critical | security fault (cold reset; revert hardware changes)
111 | BUNDLE_ERROR_EVENT | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
112 | DISP_SUPERVISOR_ERROR | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
113 | DP_LT_FAILURE | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
114 | HEAD_RG_UNDERFLOW | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
115 | CORE_CHANNEL_REGS | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
116 | WINDOW_CHANNEL_REGS | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
117 | CURSOR_CHANNEL_REGS | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
118 | HEAD_REGS | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
119 | GSP_RPC_TIMEOUT | RESET_GPU | reset_gpu | critical | GSP RPC timeout
120 | GSP_ERROR | RESET_GPU | reset_gpu | critical | GSP error
121 | C2C_ERROR | IGNORE | ignore | warning | corrected C2C link errors (reset at a service window)
122 | SPI_PMU_RPC_READ_FAIL | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
123 | SPI_PMU_RPC_WRITE_FAIL | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
124 | SPI_PMU_RPC_ERASE_FAIL | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
125 | INFOROM_FS_ERROR | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
126 | ROBUST_CHANNEL_CE10_ERROR | RESTART_APP | restart_app | warning | copy engine error (CE10)
127 | ROBUST_CHANNEL_CE11_ERROR | RESTART_APP | restart_app | warning | copy engine error (CE11)
128 | ROBUST_CHANNEL_CE12_ERROR | RESTART_APP | restart_app | warning | copy engine error (CE12)
129 | ROBUST_CHANNEL_CE13_ERROR | RESTART_APP | restart_app | warning | copy engine error (CE13)
130 | ROBUST_CHANNEL_CE14_ERROR | RESTART_APP | restart_app | warning | copy engine error (CE14)
131 | ROBUST_CHANNEL_CE15_ERROR | RESTART_APP | restart_app | warning | copy engine error (CE15)
132 | ROBUST_CHANNEL_CE16_ERROR | RESTART_APP | restart_app | warning | copy engine error (CE16)
133 | ROBUST_CHANNEL_CE17_ERROR | RESTART_APP | restart_app | warning | copy engine error (CE17)
134 | ROBUST_CHANNEL_CE18_ERROR | RESTART_APP | restart_app | warning | copy engine error (CE18)
135 | ROBUST_CHANNEL_CE19_ERROR | RESTART_APP | restart_app | warning | copy engine error (CE19)
136 | ALI_TRAINING_FAIL | RESET_GPU | reset_gpu | critical | NVLink training failed
137 | NVLINK_PRIV_ERR | IGNORE | ignore | info | NVLink privilege error (illegal peer access by an application)
138 | ROBUST_CHANNEL_DLA_ERROR | CONTACT_SUPPORT | contact_support | warning | unused (Volta or older)
139 | ROBUST_CHANNEL_OFA1_ERROR | RESTART_APP | restart_app | warning | optical flow accelerator error (OFA1)
140 | UNRECOVERABLE_ECC_ERROR_ESCAPE | RESET_GPU | reset_gpu | critical | unrecovered ECC error
141 | ROBUST_CHANNEL_FAST_PATH_ERROR | IGNORE | ignore | info | CUDA fast path error
142 | ROBUST_CHANNEL_NVENC3_ERROR | CONTACT_SUPPORT | contact_support | warning | video encoder error (NVENC3)
143 | GPU_INIT_ERROR | RESET_GPU | reset_gpu | critical | GPU initialization error
144 | NVLINK_SAW_ERROR | WORKFLOW_NVLINK5_ERR | reset_gpu | critical | NVLink5 SAW error
145 | NVLINK_RLW_ERROR | WORKFLOW_NVLINK5_ERR | reset_gpu | critical | NVLink5 RLW error
146 | NVLINK_TLW_ERROR | WORKFLOW_NVLINK5_ERR | reset_gpu | critical | NVLink5 TLW error
147 | NVLINK_TREX_ERROR | WORKFLOW_NVLINK5_ERR | reset_gpu | critical | NVLink5 TREX error
148 | NVLINK_NVLPW_CTRL_ERROR | WORKFLOW_NVLINK5_ERR | reset_gpu | critical | NVLink5 NVLPW_CTRL error
149 | NVLINK_NETIR_ERROR | WORKFLOW_NVLINK5_ERR | reset_gpu | critical | NVLink5 NETIR error
150 | NVLINK_MSE_ERROR | WORKFLOW_NVLINK5_ERR | reset_gpu | critical | NVLink5 MSE error
151 | ROBUST_CHANNEL_KEY_ROTATION_ERROR | RESTART_VM | restart_app | warning | key rotation error (restart the VM)
152 | ROBUST_CHANNEL_DLA_SMMU_ERROR | IGNORE | ignore | info | DLA SMMU error
153 | ROBUST_CHANNEL_DLA_TIMEOUT | IGNORE | ignore | info | DLA timeout
154 | GPU_RECOVERY_ACTION_CHANGED | XID_154 | contact_support | warning | GPU recovery action changed
155 | NVLINK_SW_DEFINED_ERROR | RESET_GPU | reset_gpu | warning | NVLink taken down on purpose (sleep, disable)
156 | RESOURCE_RETIREMENT_EVENT | RESET_GPU | reset_gpu | warning | resource retirement recorded: reset to apply
157 | RESOURCE_RETIREMENT_FAILURE | IGNORE | ignore | warning | resource retirement failed (no spare resources)
158 | GPU_FATAL_TIMEOUT | RESET_GPU | reset_gpu | critical | GPU fatal timeout
159 | ROBUST_CHANNEL_CHI_NON_DATA_ERROR | CHECK_UVM | reset_gpu | warning | CHI non-data error (reset if UVM or vGPU)
160 | CHANNEL_RETIREMENT_EVENT | IGNORE | ignore | info | channel retirement event
161 | CHANNEL_RETIREMENT_FAILURE | IGNORE | ignore | info | channel retirement failure
162 | PSHC_REENGAGED | - | ignore | info | power smoothing circuitry re-engaged
163 | PSHC_DISENGAGED | - | ignore | warning | power smoothing disengaged (thermal events or timeout)
164 | PSHC_LOW_LIFETIME | - | contact_support | warning | power smoothing circuitry low lifetime
165 | PSHC_ZERO_LIFETIME | - | contact_support | warning | power smoothing circuitry lifetime exhausted
166 | NVLINK_SECURE_CRYPTO_ERR | - | contact_support | warning | confidential-computing traffic before encryption
167 | PCIE_FATAL_TIMEOUT | - | reset_gpu | critical | PCIe fatal timeout
168 | REDUCED_GPU_MEMORY_CAPACITY | - | reboot | warning | errors in the write-protected region (ECC off?)
169 | SEC2_HALT_ERROR | - | reset_gpu | critical | internal micro-controller halt (SEC2)
170 | NVLINK_SECURE_OTHER | - | contact_support | warning | interrupt in confidential-computing mode
171 | UNCORRECTABLE_DRAM_ERROR | - | reset_gpu | critical | uncorrectable DRAM error (details of an Xid 48)
172 | UNCORRECTABLE_SRAM_ERROR | - | reset_gpu | critical | uncorrectable SRAM error (details of an Xid 48)
"""
# Rows where nodewarden departs from the bucket -> action rule above, and why.
REASONS = {
    32: "RESTART_APP, but the catalogue's own trigger text blames PCIe quality, not the application: warning",
    79: "RESTART_BM: drain the node, then restart it (the other GPUs' jobs must move first)",
    94: "RESTART_APP; the catalogue recommends resetting the GPU when convenient: warning",
    155: "RESET_GPU, but the link went down on purpose: warning, investigate who did it",
    156: "RESET_GPU to apply a retirement, like a pending row remap (gpu.row_remap): warning",
    159: "CHECK_UVM: reset if UVM/vGPU is in use, else ignore; nodewarden cannot tell: warning",
    162: "the catalogue gives no action", 163: "the catalogue: no GPU reset required",
    164: "the catalogue: expect to replace the GPU if power smoothing is wanted",
    165: "the catalogue: replace the GPU if power swings are not acceptable",
    166: "confidential computing only", 167: "the catalogue gives no action: treated as fatal",
    168: "the catalogue: enable ECC or boot again with a shifted WPR",
    169: "the catalogue gives no action: like Xid 62 (micro-controller halt)", 170: "confidential computing only",
    171: "the catalogue gives no action: follows Xid 48", 172: "the catalogue gives no action: follows Xid 48",
}


def _load(table: str) -> dict[int, Entry]:
    entries: dict[int, Entry] = {}
    for line in table.strip().splitlines():
        code, mnemonic, bucket, action, severity, description = (cell.strip() for cell in line.split("|"))
        if action not in ACTIONS or int(code) in entries:
            raise ValueError(f"xid catalogue row {line!r}: unknown action or repeated code")
        entries[int(code)] = Entry(int(code), mnemonic, bucket, action, Severity(severity), description)
    return entries


CATALOG: dict[int, Entry] = _load(_XIDS)


# --- NVLink5 (Xid 144-150): the catalogue's "XID 144-150 Decode" sheet ---------------------------
#
# The text is `<unit> <Fatal|Nonfatal> XC<n> i<n> Link <n> (<intrInfo> <errorStatus> <debug>...)`. The
# unit (sub-code) is printed; it is also IntrInfo[9:5] with the Xid's own number in IntrInfo[4:0]
# before R575 ("V1", the 10 bits below) and IntrInfo[6:0] from R575 ("V2"). The action follows
# from the unit and errorStatus; for NETIR_LINK_DOWN from the link-down reason, IntrInfo[25:20].
# RLW_RXPIPE rows marked `*` are promotable: with IntrInfo bit 10 (V1) or bit 7 (V2) set, or the
# driver printing "Fatal", NVIDIA's "Action 2" (RESET_GPU) applies.


class Nvl5Unit(NamedTuple):
    xid: int
    name: str
    v1: int  # IntrInfo[9:0] before R575
    v2: tuple[int, ...]  # IntrInfo[6:0] from R575
    printed: tuple[str, ...]  # how the driver spells it (V1 / V2 names)


NVL5_UNITS = (
    Nvl5Unit(144, "SAW_MVB", 0x021, (0x01,), ("SAW_MVB",)),
    Nvl5Unit(145, "RLW_CTRL", 0x062, (0x03,), ("RLW_CTRL",)),
    Nvl5Unit(145, "RLW_REMAP", 0x082, (0x04,), ("RLW_REMAP",)),
    Nvl5Unit(145, "RLW_RSPCOL", 0x0A2, (0x05,), ("RLW_RSPCOL",)),
    Nvl5Unit(145, "RLW_RXPIPE", 0x0C2, (0x06,), ("RLW_RXPIPE",)),
    Nvl5Unit(145, "RLW_SRC_TRACK", 0x0E2, (0x07,), ("RLW_SRC_TRACK",)),
    Nvl5Unit(145, "RLW_TAGSTATE", 0x102, (0x08,), ("RLW_TAGSTATE",)),
    Nvl5Unit(146, "TLW_CTRL", 0x123, (0x09,), ("TLW_CTRL",)),
    Nvl5Unit(146, "TLW_RX", 0x143, (0x0A, 0x0B), ("TLW_RX", "TLW_RX_PIPE0", "TLW_RX_PIPE1")),
    Nvl5Unit(146, "TLW_TX", 0x163, (0x0C, 0x0D), ("TLW_TX", "TLW_TX_PIPE0", "TLW_TX_PIPE1")),
    Nvl5Unit(147, "TREX", 0x184, (0x0E,), ("TREX",)),
    Nvl5Unit(148, "NVLPW", 0x005, (0x0F,), ("NVLPW_CTRL", "NVLPW")),
    Nvl5Unit(149, "NETIR_INT", 0x006, (0x18,), ("NETIR", "NETIR_INT")),
    Nvl5Unit(149, "NETIR_LINK_DOWN", 0x1C6, (0x11,), ("NETIR_LINK_EVT", "NETIR_LINK_DOWN")),
    Nvl5Unit(149, "NETIR_BER_EVENT", 0x226, (0x13,), ("NETIR_BER_EVENT",)),
    Nvl5Unit(149, "NETIR_MFDE_EVENT", 0x246, (0x14,), ("NETIR_MFDE_EVENT",)),
    Nvl5Unit(150, "MSE", 0x000, (0x00,), ("MSE DEGRADED", "MSE_DEGRADED", "MSE_WATCHDOG")),
)

# unit | key: errorStatus, rN (link-down reason N) or * (any other) | NVIDIA immediate action | severity
_NVL5_ROWS = """
SAW_MVB 0x00000001 IGNORE non-fatal
SAW_MVB 0x00000002 RESET_GPU fatal
SAW_MVB 0x00000004 IGNORE non-fatal
SAW_MVB 0x00000008 IGNORE non-fatal
SAW_MVB 0x00000010 RESET_GPU fatal
SAW_MVB 0x00000020 IGNORE non-fatal
RLW_CTRL 0x80000000 IGNORE non-fatal
RLW_REMAP 0x00000001 XID_154_EVAL non-fatal
RLW_REMAP 0x00000002 XID_154_EVAL non-fatal
RLW_REMAP 0x00000004 XID_154_EVAL non-fatal
RLW_REMAP 0x00000008 XID_154_EVAL non-fatal
RLW_REMAP 0x00000010 XID_154_EVAL non-fatal
RLW_REMAP 0x00000020 XID_154_EVAL non-fatal
RLW_REMAP 0x00000040 RESET_GPU fatal
RLW_REMAP 0x00000080 RESET_GPU fatal
RLW_REMAP 0x00000100 IGNORE non-fatal
RLW_REMAP 0x00000200 IGNORE non-fatal
RLW_REMAP 0x80000000 IGNORE non-fatal
RLW_RSPCOL 0x00000001 IGNORE non-fatal
RLW_RSPCOL 0x00000002 RESET_GPU fatal
RLW_RSPCOL 0x80000000 IGNORE non-fatal
RLW_RXPIPE 0x00000001 IGNORE non-fatal*
RLW_RXPIPE 0x00000002 IGNORE non-fatal*
RLW_RXPIPE 0x00000004 IGNORE non-fatal*
RLW_RXPIPE 0x00000008 IGNORE non-fatal
RLW_RXPIPE 0x80000000 IGNORE non-fatal
RLW_SRC_TRACK 0x00000001 RESET_GPU fatal
RLW_SRC_TRACK 0x00000002 IGNORE non-fatal
RLW_SRC_TRACK 0x00000004 XID_154_EVAL non-fatal
RLW_SRC_TRACK 0x00000008 XID_154_EVAL non-fatal
RLW_SRC_TRACK 0x00000010 RESET_GPU fatal
RLW_SRC_TRACK 0x00000020 RESET_GPU fatal
RLW_SRC_TRACK 0x80000000 IGNORE non-fatal
RLW_TAGSTATE 0x00000001 IGNORE non-fatal
RLW_TAGSTATE 0x00000002 RESET_GPU fatal
RLW_TAGSTATE 0x00010000 IGNORE non-fatal
RLW_TAGSTATE 0x00020000 RESET_GPU fatal
RLW_TAGSTATE 0x00100000 RESET_GPU fatal
RLW_TAGSTATE 0x80000000 IGNORE non-fatal
TLW_CTRL 0x00000001 IGNORE non-fatal
TLW_CTRL 0x00000002 IGNORE non-fatal
TLW_CTRL 0x00000004 RESET_GPU fatal
TLW_CTRL 0x80000000 IGNORE non-fatal
TLW_RX 0x00000001 IGNORE non-fatal
TLW_RX 0x00000002 IGNORE non-fatal
TLW_RX 0x00000004 RESET_GPU fatal
TLW_RX 0x80000000 IGNORE non-fatal
TLW_TX 0x00000001 IGNORE non-fatal
TLW_TX 0x00000002 IGNORE non-fatal
TLW_TX 0x00000004 RESET_GPU fatal
TLW_TX 0x80000000 IGNORE non-fatal
TREX 0x00000001 IGNORE non-fatal
TREX 0x80000000 IGNORE non-fatal
NVLPW 0x80000000 IGNORE non-fatal
NETIR_INT * RESET_GPU link-fatal
NETIR_LINK_DOWN r38 IGNORE link-fatal
NETIR_LINK_DOWN r40 IGNORE fatal
NETIR_LINK_DOWN * RESET_GPU link-fatal
NETIR_BER_EVENT 0x00000000 IGNORE non-fatal
NETIR_BER_EVENT 0x00000001 IGNORE non-fatal
NETIR_BER_EVENT 0x00000002 IGNORE non-fatal
NETIR_BER_EVENT 0x00000003 IGNORE non-fatal
NETIR_MFDE_EVENT 0x00000001 RESET_GPU fatal
NETIR_MFDE_EVENT 0x00000003 IGNORE non-fatal
NETIR_MFDE_EVENT 0x00000004 RESET_GPU fatal
NETIR_MFDE_EVENT 0x00000005 RESET_GPU fatal
NETIR_MFDE_EVENT 0x00000007 RESET_GPU fatal
MSE * RESET_GPU fatal
"""
# Reasons 0-37 and 42-43 are RESET_GPU (the `*` row); 32-37 name the peer device as the source.
_NVL5_BUCKETS = {  # bucket -> (action, severity, advice)
    "RESET_GPU": ("reset_gpu", Severity.CRITICAL, "reset the GPU"),
    "IGNORE": ("ignore", Severity.WARNING, "no action; investigate if it repeats"),
    "XID_154_EVAL": ("restart_app", Severity.WARNING, "follow the Xid 154 logged with it, else restart the app"),
}


class Nvl5Row(NamedTuple):
    bucket: str
    kind: str  # the catalogue's severity: non-fatal, fatal, link-fatal
    promotable: bool


def _load_nvl5(table: str) -> dict[str, dict[str, Nvl5Row]]:
    names = {unit.name for unit in NVL5_UNITS}
    rows: dict[str, dict[str, Nvl5Row]] = {}
    for line in table.strip().splitlines():
        unit, key, bucket, kind = line.split()
        if unit not in names or bucket not in _NVL5_BUCKETS:
            raise ValueError(f"NVLink5 decode row {line!r}: unknown unit or bucket")
        key = key if key == "*" or key.startswith("r") else f"{int(key, 16):#010x}"
        rows.setdefault(unit, {})[key] = Nvl5Row(bucket, kind.rstrip("*"), kind.endswith("*"))
    return rows


NVL5_ROWS = _load_nvl5(_NVL5_ROWS)


def _unit(code: int, fields: NvLink5Fields) -> Nvl5Unit | None:
    """The sub-code: by its printed name, else by IntrInfo (V1 layout first, then V2)."""
    candidates = [unit for unit in NVL5_UNITS if unit.xid == code]
    printed = fields.unit.upper()
    for unit in candidates:
        if printed in unit.printed or any(part in unit.printed for part in printed.split("/")):
            return unit
    intr = fields.intr_info
    if intr is None:
        return None
    return (next((u for u in candidates if intr & 0x3FF == u.v1), None)
            or next((u for u in candidates if intr & 0x7F in u.v2), None))


def _promoted(unit: Nvl5Unit, fields: NvLink5Fields) -> bool:
    intr = fields.intr_info
    if fields.fatal:
        return True
    if intr is None:
        return False
    if intr & 0x3FF == unit.v1:
        return bool(intr & 0x400)
    return intr & 0x7F in unit.v2 and bool(intr & 0x80)


def _row(unit: Nvl5Unit, fields: NvLink5Fields) -> Nvl5Row | None:
    rows = NVL5_ROWS.get(unit.name, {})
    if unit.name == "NETIR_LINK_DOWN" and fields.intr_info is not None:
        return rows.get(f"r{(fields.intr_info >> 20) & 0x3F}") or rows.get("*")
    status = fields.error_status
    if status is None:
        return rows.get("*")
    if (exact := rows.get(f"{status:#010x}")) is not None:
        return exact
    bits = [rows.get(f"{1 << bit:#010x}") for bit in range(32) if status >> bit & 1]
    if bits and all(row is not None for row in bits):  # several bits at once: the worst of their rows
        return max((row for row in bits if row is not None), key=lambda r: r.bucket == "RESET_GPU")
    return rows.get("*")


def decode_nvlink5(code: int, message: str) -> Verdict:
    """An NVLink5 Xid's verdict from its sub-code, error status and the catalogue's decode."""
    fields = parse_nvlink5(message)
    if fields is None:
        return Verdict(f"NVLink5 error (Xid {code}; text without the sub-code fields: treated as fatal)",
                       Severity.CRITICAL, "reset_gpu", "WORKFLOW_NVLINK5_ERR")
    where = f"link {fields.link}" + (f", status {fields.error_status:#010x}" if fields.error_status is not None else "")
    unit = _unit(code, fields)
    row = _row(unit, fields) if unit is not None else None
    name = unit.name if unit is not None else fields.unit
    if unit is None or row is None:
        word = "fatal" if fields.fatal else "non-fatal"
        action, severity = ("reset_gpu", Severity.CRITICAL) if fields.fatal else ("contact_support", Severity.WARNING)
        return Verdict(f"NVLink5 {name} {word}, {where} (not in the catalogue's decode: as the driver says)",
                       severity, action, "WORKFLOW_NVLINK5_ERR")
    bucket, kind = row.bucket, row.kind
    if row.promotable and _promoted(unit, fields):
        bucket, kind = "RESET_GPU", "fatal (promoted)"
    action, severity, advice = _NVL5_BUCKETS[bucket]
    if unit.name == "NETIR_LINK_DOWN" and fields.intr_info is not None:
        where += f", reason {(fields.intr_info >> 20) & 0x3F}"
    return Verdict(f"NVLink5 {name} {kind}, {where}: {advice}", severity, action, bucket)


# --- Xid 154 and the other workflows ---------------------------------------------------------------

# "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"; values as NVML's
# NVML_GPU_RECOVERY_ACTION_* (checks/gpu_recovery.py)
_RECOVERY_RE = re.compile(r"to (0x[0-9a-fA-F]+|\d+)\s*\(([^)]*)\)")
RECOVERY_154 = {
    0: ("None", "ignore", Severity.INFO),
    1: ("GPU Reset Required", "reset_gpu", Severity.CRITICAL),
    2: ("Node Reboot Required", "reboot", Severity.CRITICAL),
    3: ("Drain P2P", "drain", Severity.WARNING),
    4: ("Drain and Reset", "drain", Severity.CRITICAL),
}


def decode_154(message: str) -> Verdict:
    match = _RECOVERY_RE.search(message)
    if match:
        value = int(match.group(1), 0)
        named = {name.lower(): key for key, (name, _, _) in RECOVERY_154.items()}
        key = value if value in RECOVERY_154 else named.get(match.group(2).strip().lower())
        if key is not None:
            name, action, severity = RECOVERY_154[key]
            return Verdict(f"GPU recovery action changed to {name}", severity, action, "XID_154")
    entry = CATALOG[154]
    return Verdict(f"{entry.description} (see gpu.recovery_action)", entry.severity, entry.action, entry.bucket)


def classify(code: int, message: str = "", companions: Collection[int] = ()) -> Verdict:
    """The verdict for one Xid: the catalogue row, decoded from its text where the catalogue says so.

    `companions` are the other Xids of the same GPU since boot (Xid 48 with 63 or 64 is DRAIN_AND_RESET).
    """
    if code in NVLINK5:
        return decode_nvlink5(code, message)
    if code == 154:
        return decode_154(message)
    entry = CATALOG.get(code)
    if entry is None:
        return Verdict(f"Xid {code} (not in nodewarden's table: see NVIDIA's Xid catalog)", Severity.WARNING,
                       "contact_support")
    if code == 48 and {63, 64} & set(companions):
        return Verdict("double-bit ECC error with row remapping (Xid 63/64): drain the node, then reset the GPU",
                       Severity.CRITICAL, "drain", "DRAIN_AND_RESET")
    return Verdict(entry.description, entry.severity, entry.action, entry.bucket)


def rank(verdict: Verdict, code: int = 0) -> tuple[int, int, int, int]:
    """Orders verdicts: severity, then whether it is the GPU's fault, then how disruptive the action is."""
    return (SEVERITY_RANK[verdict.severity], verdict.action not in APPLICATION_ACTIONS,
            ACTION_RANK.get(verdict.action, 2), code)
