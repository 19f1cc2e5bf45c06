"""Every session-state and widget key the app uses, in one place."""

# session state (not widgets)
SETTINGS = "ds.settings"          # ui.widgets.params.Settings of the current sidebar
QP_LOADED = "ds.qp_loaded"        # query params were copied into the widgets once
QP_BAD = "ds.qp_bad"              # names of link parameters that did not parse
QP_LINK_ERRORS = "ds.qp_link_errors"  # messages for link values that are none of a widget's choices
QP_PATHS = "ds.qp_paths"          # the server-path values a link set ({name: value}; see params.link_safe)
RUN = "ds.run"                    # ui.widgets.live.LiveRun of the playground
RUN_SIGNATURE = "ds.run_signature"
RUN_MADE_WITH = "ds.run_made_with"  # the settings (in words, ui.views.made_with) that made the playground run
BRANCH = "ds.branch"              # a LiveRun branched by forcing a candidate
CURSOR = "ds.cursor"              # index of the playground step on view
REPLAY = "ds.replay"              # Trace uploaded on the traces page
REPLAY_CURSOR = "ds.replay_cursor"
REPLAY_VIEW = "tr.view"
COMPARE = "ds.compare"            # dict label -> Trace of the last comparison
COMPARE_MADE_WITH = "ds.compare_made_with"  # the settings and lanes (in words) that made it
COMPARE_KEPT = "ds.compare_kept"  # the lane pickers' values, restored after another page (keep_lanes)
LAST_RENDER_MS = "ds.last_render_ms"
DRAFTING_LATER = "ds.drafting_later"  # fills the sidebar's sources caption once this run loads the model

# sidebar widgets
MODEL = "w.model"
DEVICE = "w.device"
DTYPE = "w.dtype"
PROMPT = "w.prompt"
CHAT = "w.chat"
STRATEGY = "w.strategy"
SEED = "w.seed"
MAX_NEW = "w.max_new"
TOP_N = "w.top_n"
GGUF_FILE = "w.gguf_file"         # model options (the sidebar's "Advanced model options")
DEVICE_MAP = "w.device_map"
MAX_MEMORY = "w.max_memory"
OFFLOAD_FOLDER = "w.offload_folder"
FAST_PATH = "w.fast_path"

# playground widgets
STEP = "pg.step"
RUN_N = "pg.run_n"
N_STEPS = "pg.n_steps"
RUN_END = "pg.run_end"
STOP = "pg.stop"
STOP_DONE = "pg.stop_done"          # the disabled Stop drawn in its place when a run ends in a rerun
BACK = "pg.back"
FORWARD = "pg.forward"
RESET = "pg.reset"
FORCE_PICK = "pg.force_pick"
FORCE = "pg.force"
ADOPT_BRANCH = "pg.adopt_branch"
VIEW = "pg.view"                  # which playground view is drawn (only that one renders)
FLASH = "ds.flash"                # one-line message for the next rerun
RUNNING = "ds.running"            # a long run in progress: the step count it runs to
DROP_BRANCH = "pg.drop_branch"
PRESET = "pg.preset"              # + index: the preset prompt buttons
QP_STEP = "step"                  # query parameter: the playground step on view (kept by the sidebar)
LINK_STEP_READ = "ds.link_step_read"  # the link's step was replayed (or refused) once

# traces page
UPLOAD = "tr.upload"
DOWNLOAD = "tr.download"

# compare page
LANES = "cmp.lanes"
COMPARE_RUN = "cmp.run"
COMPARE_DRAFTING = "cmp.drafting"   # show the drafting (rejected drafts, residual and bonus marks) in the lanes


def param_key(scope: str, strategy: str, name: str) -> str:
    """Widget key of one strategy parameter; `scope` is 'w' for the sidebar, 'cmp0'.. for lanes."""
    return f"{scope}.param.{strategy}.{name}"


def cost_file_key(param_key_: str) -> str:
    """The uploader of a cost table, beside the cost-table mode widget `param_key_`."""
    return f"{param_key_}.file"


def cost_link_key(param_key_: str) -> str:
    """Session state: the cost table a link gave (its milliseconds, comma-separated)."""
    return f"{param_key_}.link"


def lane_strategy(lane: int) -> str:
    return f"cmp{lane}.strategy"

# what-if page
WHATIF_SOURCE = "wi.source"
WHATIF_UPLOAD = "wi.upload"
WHATIF_TRACE = "ds.whatif_trace"    # Trace uploaded on the what-if page
WHATIF_MAX_GAMMA = "wi.max_gamma"
WHATIF_BUDGETS = "wi.budgets"

# tour page
QP_TOUR_STOP = "stop"               # query parameter: the tour stop on view (kept by the sidebar)
TOUR_STOP = "ds.tour_stop"          # id of the tour stop on view (survives leaving the page)
TOUR_BAD_STOP = "ds.tour_bad_stop"  # an unknown stop named by the link, to warn about once
TOUR_LIVE = "ds.tour_live"          # dict stop id -> Trace of the stop's last live run
TOUR_SELECT = "tour.select"
TOUR_PREV = "tour.prev"
TOUR_NEXT = "tour.next"
TOUR_RUN = "tour.run_live"
TOUR_OPEN = "tour.open_playground"
TOUR_SOURCE = "tour.source"         # Recorded | Live, once a live run exists


def tour_cursor(stop_id: str, source: str) -> str:
    return f"tour.{stop_id}.{source}.step"

# lab widgets and state
LAB = "ds.lab"                    # {(section, model key, config): measured result}
LAB_MADE = "ds.lab_made"          # {section: (its last measured result's LAB key, its settings in words)}
LAB_TOKENS = "lab.tokens"
LAB_BATCHES = "lab.batches"
LAB_REPEATS = "lab.repeats"
LAB_COST_RUN = "lab.cost_run"
LAB_TP_BATCHES = "lab.tp_batches"
LAB_TP_STEPS = "lab.tp_steps"
LAB_TP_RUN = "lab.tp_run"
LAB_ACC_SOURCE = "lab.acc_source"
LAB_MEM_SOURCE = "lab.mem_source"
LAB_LL_TEMP = "lab.ll_temp"
LAB_LL_TOPK = "lab.ll_topk"
LAB_LL_DTEMP = "lab.ll_dtemp"
LAB_LL_DTOPK = "lab.ll_dtopk"
LAB_LL_CANDS = "lab.ll_cands"
LAB_LL_THRESHOLD = "lab.ll_threshold"
LAB_LL_SAMPLES = "lab.ll_samples"
LAB_LL_SEED = "lab.ll_seed"
LAB_LL_RUN = "lab.ll_run"
