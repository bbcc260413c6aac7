/*
 * auto_resume.c - SPANK plugin for --auto-resume[=N] (Slurm 22.05 and later).
 *
 * A job opts in to automatic requeue after a node fault with --auto-resume[=N]
 * on sbatch, salloc or srun.  The plugin only validates the value and makes it
 * visible; every decision about requeueing is taken by the controller.
 *
 *   allocator (sbatch/salloc), local (srun):
 *       job-control env AUTO_RESUME=N.  Slurm hands it to job_submit/lua as
 *       job_desc.spank_job_env and to Prolog/Epilog(Slurmctld) as
 *       SPANK_AUTO_RESUME.
 *       With checkpoint_root=, every new job (with the option or not) also
 *       gets a random job key, job-control env HYPERPOD_JOB_KEY: the job's
 *       processes see SLURM_SPANK_HYPERPOD_JOB_KEY, and it survives a requeue
 *       (it is part of the job record).  A job id Slurm hands out again after
 *       its state was reset gets a new key.
 *   remote (slurmstepd, runs as root, knows the job id):
 *       task env HYPERPOD_AUTO_RESUME=N, HYPERPOD_CHECKPOINT_DIR=<root>/<jobid>
 *       (unless the job set it), and a marker file <statedir>/<jobid> for
 *       steps started with --auto-resume inside a batch script, which the
 *       job_submit hook never sees.  HYPERPOD_CHECKPOINT_JOB_KEY=<key> when
 *       HYPERPOD_CHECKPOINT_DIR is one the plugin chose (and unset otherwise):
 *       the checkpoint library then refuses a directory made for another key,
 *       so a reused job id never restores an old job's checkpoints, while a
 *       directory the job chose itself is left alone.
 *       Every step: the job's own directories, <progress_root>/<jobid> and
 *       <memory_root>/<jobid> (and <checkpoint_root>/<jobid> for the steps
 *       above), made by root mode 0700 and handed to the job's user before
 *       any task starts (jobdirs.c).  One that someone else made first is left
 *       alone and the job goes without that feature on the node (the
 *       checkpoint directory becomes <checkpoint_root>/<jobid>.<key>); the
 *       node's first task says so in the job's stderr (task_init).
 *
 *   job epilog (job_script context, root): the job's progress directory is
 *       removed with its records (as the job's user), its memory tier
 *       directory only if empty (a requeued job restores from it).
 *
 *   local (srun inside an allocation), with step_helper=:
 *       an srun whose own command line has --auto-resume[=N] (N > 0) hands
 *       itself over to the helper: execv(step_helper, ["hyperpod",
 *       "step-retry", "--", <srun's command line>]) with
 *       HYPERPOD_STEP_AUTO_RESUME=N.  The helper runs the same srun again
 *       with HYPERPOD_STEP_WRAPPED=1 (no second hand-over), and asks the
 *       controller whether to retry a failed step inside the job.  An srun
 *       that only inherits the option from sbatch is not handed over: its job
 *       is requeued as a whole, as before.  If the hand-over fails, srun runs
 *       on without step retry (logged).
 *
 * plugstack.conf arguments (all optional, each at most once):
 *   statedir=/abs/dir         where slurmstepd writes marker files
 *   step_helper=/abs/path     the hyperpod command, for step retry
 *   checkpoint_root=/abs/dir  parent of HYPERPOD_CHECKPOINT_DIR, or
 *   checkpoint_root=s3://bucket[/prefix]  (an object store)
 *   progress_root=/abs/dir    where ranks keep progress records (%n: host name)
 *   memory_root=/abs/dir      the checkpoint memory tier's root (%n: host name)
 *   max=M                     largest accepted N (default 1000)
 *   default=D                 N for a bare --auto-resume (default 1)
 */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

#include "jobdirs.h"

SPANK_PLUGIN(auto_resume, 1);

#define AR_OPTION "auto-resume"
#define AR_DEFAULT_MAX 1000L
#define AR_LIMIT_MAX 1000000L	/* bound for max= itself */
#define AR_DEFAULT_BARE 1L
#define AR_KEY_BYTES 16			/* job key: 128 random bits, 32 hex digits */
#define AR_KEY_ENV "HYPERPOD_JOB_KEY"	/* job-control env name */
/* ... as the job sees it, and as tasks get it along with the directory */
#define AR_KEY_JOB_ENV "SLURM_SPANK_" AR_KEY_ENV
#define AR_KEY_TASK_ENV "HYPERPOD_CHECKPOINT_JOB_KEY"
#define AR_WRAPPED_ENV "HYPERPOD_STEP_WRAPPED"	/* set by the step-retry helper */
#define AR_BUDGET_ENV "HYPERPOD_STEP_AUTO_RESUME"
#define AR_CMDLINE_MAX 65536
#define AR_ARGS_MAX 1024

struct ar_config {
	char statedir[PATH_MAX];	/* "" = write no marker */
	char checkpoint_root[PATH_MAX];	/* "" = leave HYPERPOD_CHECKPOINT_DIR */
	char step_helper[PATH_MAX];	/* "" = no step retry hand-over */
	char progress_root[PATH_MAX];	/* "" = make no progress directories */
	char memory_root[PATH_MAX];	/* "" = make no memory tier directories */
	long max;
	long bare;
};

#define AR_CONFIG_DEFAULTS { "", "", "", "", "", AR_DEFAULT_MAX, AR_DEFAULT_BARE }

static struct ar_config cfg = AR_CONFIG_DEFAULTS;

/* The option value, kept from the callback: spank_option_getopt() is not
 * available in allocator context after option processing. -1 = not given. */
static long ar_value = -1;

static int ar_option_cb(int val, const char *optarg, int remote);

/*
 * has_arg = 2 (getopt's optional_argument): "--auto-resume" alone means
 * N = default, and the following word is never taken as the value.  With
 * has_arg = 1, "srun --auto-resume python train.py" would parse "python" as N.
 * The value must be attached: --auto-resume=3.
 */
static char ar_usage[256];
static struct spank_option ar_option = {
	AR_OPTION, "N", ar_usage, 2, 0, ar_option_cb,
};

static const char *ar_context(void)
{
	switch (spank_context()) {
	case S_CTX_LOCAL:
		return "local";
	case S_CTX_REMOTE:
		return "remote";
	case S_CTX_ALLOCATOR:
		return "allocator";
	case S_CTX_SLURMD:
		return "slurmd";
	case S_CTX_JOB_SCRIPT:
		return "job_script";
	default:
		return "unknown";
	}
}

/* Every message: "auto-resume: <context>: couldn't <verb>: <why>"; fmt is "<verb>: <why>". */
static void ar_error(const char *fmt, ...) __attribute__ ((format (printf, 1, 2)));

static void ar_error(const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	slurm_error("auto-resume: %s: couldn't %s", ar_context(), msg);
}

/* Strict decimal in [lo, hi]: digits only, no sign, no blanks, no suffix. */
static int ar_parse_long(const char *s, long lo, long hi, long *out)
{
	char *end = NULL;
	long v;

	if (!s || !*s || strspn(s, "0123456789") != strlen(s))
		return -1;
	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || *end || v < lo || v > hi)
		return -1;
	*out = v;
	return 0;
}

static int ar_parse_path(const char *arg, const char *val, char *dst, size_t len)
{
	if (val[0] != '/') {
		ar_error("parse plugstack argument '%s': want an absolute path", arg);
		return -1;
	}
	if (strlen(val) >= len) {
		ar_error("parse plugstack argument '%s': path too long", arg);
		return -1;
	}
	memcpy(dst, val, strlen(val) + 1);
	return 0;
}

/*
 * s3://bucket[/prefix]: a bucket name as S3 allows it (3-63 of a-z, 0-9, '.',
 * '-', starting and ending with a letter or digit, no "..") and a prefix of
 * segments of A-Z a-z 0-9 '.' '_' '-', none empty, "." or "..", so that
 * <root>/<jobid> is a well-formed key prefix.  Returns 0 if valid.
 */
static int ar_check_s3(const char *val)
{
	const char *b, *end, *seg;
	size_t blen, i;

	/* the prefix first: "x" has nothing at val + 5 to read */
	if (strncmp(val, "s3://", 5))
		return -1;
	b = val + 5;
	end = strchr(b, '/');
	blen = end ? (size_t) (end - b) : strlen(b);
	if (blen < 3 || blen > 63)
		return -1;
	for (i = 0; i + 1 < blen; i++)
		if (b[i] == '.' && b[i + 1] == '.')
			return -1;
	for (i = 0; i < blen; i++)
		if (!strchr("abcdefghijklmnopqrstuvwxyz0123456789.-", b[i]))
			return -1;
	if (!strchr("abcdefghijklmnopqrstuvwxyz0123456789", b[0]) ||
	    !strchr("abcdefghijklmnopqrstuvwxyz0123456789", b[blen - 1]))
		return -1;
	for (seg = end; seg; seg = strchr(seg + 1, '/')) {
		const char *next = strchr(seg + 1, '/');
		size_t n = next ? (size_t) (next - seg - 1) : strlen(seg + 1);

		if (n == 0 || (n == 1 && seg[1] == '.') ||
		    (n == 2 && seg[1] == '.' && seg[2] == '.'))
			return -1;
		if (strspn(seg + 1, "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
			   "abcdefghijklmnopqrstuvwxyz0123456789._-") < n)
			return -1;
	}
	return 0;
}

static int ar_parse_root(const char *arg, const char *val, char *dst, size_t len)
{
	if (val[0] == '/')
		return ar_parse_path(arg, val, dst, len);
	if (ar_check_s3(val)) {
		ar_error("parse plugstack argument '%s': want an absolute path or "
			 "s3://bucket[/prefix]", arg);
		return -1;
	}
	if (strlen(val) >= len) {
		ar_error("parse plugstack argument '%s': path too long", arg);
		return -1;
	}
	memcpy(dst, val, strlen(val) + 1);
	return 0;
}

/*
 * A node-local root (progress_root=, memory_root=): an absolute path in which "%n"
 * stands for this node's host name, where several nodes share one machine (the local
 * cluster gives each node its own /dev/shm this way).  No other '%' is allowed.
 */
static int ar_parse_node_root(const char *arg, const char *val, char *dst, size_t len)
{
	const char *pct;

	for (pct = strchr(val, '%'); pct; pct = strchr(pct + 2, '%')) {
		if (pct[1] != 'n') {
			ar_error("parse plugstack argument '%s': want an absolute path "
				 "(%%n, the node's host name, is the only substitution)", arg);
			return -1;
		}
	}
	return ar_parse_path(arg, val, dst, len);
}

enum ar_key {
	AR_STATEDIR, AR_CHECKPOINT_ROOT, AR_STEP_HELPER, AR_PROGRESS_ROOT, AR_MEMORY_ROOT,
	AR_MAX, AR_DEFAULT, AR_NKEYS
};

static const char *const ar_keys[AR_NKEYS] = {
	[AR_STATEDIR] = "statedir",
	[AR_CHECKPOINT_ROOT] = "checkpoint_root",
	[AR_STEP_HELPER] = "step_helper",
	[AR_PROGRESS_ROOT] = "progress_root",
	[AR_MEMORY_ROOT] = "memory_root",
	[AR_MAX] = "max",
	[AR_DEFAULT] = "default",
};

static int ar_find_key(const char *arg, size_t klen)
{
	int k;

	for (k = 0; k < AR_NKEYS; k++)
		if (strlen(ar_keys[k]) == klen && !strncmp(arg, ar_keys[k], klen))
			return k;
	return -1;
}

/*
 * Parse the plugstack.conf arguments into cfg.  Called from every callback
 * (slurm_spank_init is not called in every context); each call starts from
 * the defaults, so the result does not depend on the order of calls.
 */
static int ar_parse_args(int ac, char **av)
{
	struct ar_config c = AR_CONFIG_DEFAULTS;
	int seen[AR_NKEYS] = { 0 };
	int i;

	for (i = 0; i < ac; i++) {
		const char *arg = av[i], *eq = strchr(arg, '=');
		int key = ar_find_key(arg, eq ? (size_t) (eq - arg) : strlen(arg));
		int bad = 0;

		if (key < 0) {
			ar_error("parse plugstack argument '%s': unknown key (known: "
				 "statedir=, checkpoint_root=, progress_root=, "
				 "memory_root=, step_helper=, max=, default=)", arg);
			return -1;
		}
		if (!eq) {
			ar_error("parse plugstack argument '%s': want %s=VALUE",
				 arg, ar_keys[key]);
			return -1;
		}
		if (seen[key]++) {
			ar_error("parse plugstack argument '%s': %s= given twice",
				 arg, ar_keys[key]);
			return -1;
		}
		switch (key) {
		case AR_STATEDIR:
			bad = ar_parse_path(arg, eq + 1, c.statedir, sizeof(c.statedir));
			break;
		case AR_STEP_HELPER:
			bad = ar_parse_path(arg, eq + 1, c.step_helper,
					    sizeof(c.step_helper));
			break;
		case AR_CHECKPOINT_ROOT:
			bad = ar_parse_root(arg, eq + 1, c.checkpoint_root,
					    sizeof(c.checkpoint_root));
			break;
		case AR_PROGRESS_ROOT:
			bad = ar_parse_node_root(arg, eq + 1, c.progress_root,
						 sizeof(c.progress_root));
			break;
		case AR_MEMORY_ROOT:
			bad = ar_parse_node_root(arg, eq + 1, c.memory_root,
						 sizeof(c.memory_root));
			break;
		case AR_MAX:
		case AR_DEFAULT:
			if (ar_parse_long(eq + 1, 0, AR_LIMIT_MAX,
					  key == AR_MAX ? &c.max : &c.bare)) {
				ar_error("parse plugstack argument '%s': want an "
					 "integer 0..%ld", arg, AR_LIMIT_MAX);
				bad = -1;
			}
			break;
		}
		if (bad)
			return -1;
	}
	if (c.bare > c.max) {
		ar_error("parse plugstack argument 'default=%ld': larger than max=%ld",
			 c.bare, c.max);
		return -1;
	}
	cfg = c;
	return 0;
}

/*
 * How Slurm forwards a bare --auto-resume (NULL optarg): to the batch step as
 * "" and, through the job's environment, to every srun inside the job as
 * "(null)" in this variable.  Those spellings mean "bare" only when they were
 * forwarded; a user who types --auto-resume= gets an error.
 */
#define AR_FORWARD_ENV "SLURM_SPANK__SLURM_SPANK_OPTION_auto_resume_auto_resume"

static int ar_is_forwarded_bare(const char *optarg, int remote)
{
	const char *fwd;

	if (strcmp(optarg, "") && strcmp(optarg, "(null)"))
		return 0;
	if (remote)
		return 1;
	fwd = getenv(AR_FORWARD_ENV);
	return fwd && !strcmp(fwd, optarg);
}

static int ar_option_cb(int val, const char *optarg, int remote)
{
	long v;

	(void) val;
	if (!optarg || ar_is_forwarded_bare(optarg, remote)) {
		ar_value = cfg.bare;
		return 0;
	}
	if (ar_parse_long(optarg, 0, cfg.max, &v)) {
		ar_error("parse --%s=%s: want an integer 0..%ld", AR_OPTION, optarg,
			 cfg.max);
		return -1;
	}
	ar_value = v;
	return 0;
}

static void ar_format_step(uint32_t stepid, char *buf, size_t len)
{
	switch (stepid) {
	case SLURM_BATCH_SCRIPT:
		snprintf(buf, len, "batch");
		break;
	case SLURM_EXTERN_CONT:
		snprintf(buf, len, "extern");
		break;
	case SLURM_INTERACTIVE_STEP:
		snprintf(buf, len, "interactive");
		break;
	default:
		snprintf(buf, len, "%u", stepid);
	}
}

static int ar_write_all(int fd, const char *buf, size_t len)
{
	while (len > 0) {
		ssize_t n = write(fd, buf, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -1;
		buf += n;
		len -= (size_t) n;
	}
	return 0;
}

/*
 * Write <statedir>/<jobid> atomically (temporary file, fsync, rename), so the
 * node agent never reads a partial marker.  Several steps or nodes may write
 * the same job's marker: each uses its own temporary file, the last rename wins.
 */
static int ar_write_marker(uint32_t jobid, uint32_t stepid)
{
	char path[PATH_MAX], tmp[PATH_MAX] = "", host[256] = "", step[16], line[512];
	int fd = -1, n;

	if (gethostname(host, sizeof(host) - 1) < 0) {
		ar_error("write marker: gethostname: %s", strerror(errno));
		goto fail;
	}
	ar_format_step(stepid, step, sizeof(step));
	n = snprintf(line, sizeof(line), "auto_resume=%ld step=%s node=%s\n",
		     ar_value, step, host);
	if (n < 0 || (size_t) n >= sizeof(line)) {
		ar_error("write marker: line too long for job %u", jobid);
		goto fail;
	}
	if ((size_t) snprintf(path, sizeof(path), "%s/%u", cfg.statedir, jobid)
	    >= sizeof(path) ||
	    (size_t) snprintf(tmp, sizeof(tmp), "%s/.%u.XXXXXX", cfg.statedir, jobid)
	    >= sizeof(tmp)) {
		tmp[0] = '\0';
		ar_error("write marker: path under %s too long", cfg.statedir);
		goto fail;
	}
	if ((fd = mkstemp(tmp)) < 0) {
		ar_error("write marker: create %s: %s", tmp, strerror(errno));
		tmp[0] = '\0';
		goto fail;
	}
	if (fchmod(fd, 0644) < 0 || ar_write_all(fd, line, (size_t) n) < 0 ||
	    fsync(fd) < 0) {
		ar_error("write marker: write %s: %s", tmp, strerror(errno));
		goto fail;
	}
	if (close(fd) < 0) {
		fd = -1;
		ar_error("write marker: close %s: %s", tmp, strerror(errno));
		goto fail;
	}
	fd = -1;
	if (rename(tmp, path) < 0) {
		ar_error("write marker: rename %s to %s: %s", tmp, path, strerror(errno));
		goto fail;
	}
	return 0;

fail:
	if (fd >= 0)
		close(fd);
	if (tmp[0])
		unlink(tmp);
	return -1;
}

/* A job key as the plugin makes them: 32 lowercase hex digits. */
static int ar_valid_key(const char *key)
{
	return strlen(key) == 2 * AR_KEY_BYTES &&
		strspn(key, "0123456789abcdef") == 2 * AR_KEY_BYTES;
}

/*
 * Allocator and local context: give a new job its key.  sbatch and salloc
 * always make a new job; srun makes one only outside an existing job.  Inside
 * one (a batch script, an salloc shell) srun keeps the job's key, which the
 * job's environment carries as SLURM_SPANK_*, and a job that has none (made
 * before checkpoint_root was set) gets none.  srun's own job-control lookup
 * cannot be relied on for this (22.05's srun does not export it to plugins),
 * so the environment decides.  sbatch and salloc pass the job-control env to
 * the job as SLURM_SPANK_*; srun does not, so the key goes into its own
 * environment, which its tasks inherit.
 */
static int ar_job_key(spank_t sp)
{
	unsigned char raw[AR_KEY_BYTES];
	char key[2 * AR_KEY_BYTES + 1];
	const char *inherited;
	spank_err_t err;
	size_t i;

	if (spank_context() == S_CTX_LOCAL) {
		inherited = getenv(AR_KEY_JOB_ENV);
		if (inherited && ar_valid_key(inherited))
			return 0;
		if (getenv("SLURM_JOB_ID"))
			return 0;	/* inside a job made without a key */
	}
	if (getrandom(raw, sizeof(raw), 0) != (ssize_t) sizeof(raw)) {
		ar_error("make job key: getrandom: %s", strerror(errno));
		return -1;
	}
	for (i = 0; i < sizeof(raw); i++)
		snprintf(key + 2 * i, 3, "%02x", raw[i]);
	err = spank_job_control_setenv(sp, AR_KEY_ENV, key, 1);
	if (err != ESPANK_SUCCESS) {
		ar_error("set job control env %s: %s", AR_KEY_ENV,
			 spank_strerror(err));
		return -1;
	}
	if (spank_context() == S_CTX_LOCAL && setenv(AR_KEY_JOB_ENV, key, 1) < 0) {
		ar_error("set %s: %s", AR_KEY_JOB_ENV, strerror(errno));
		return -1;
	}
	return 0;
}

/* The job's key as its job-control environment carries it (remote context). */
static int ar_job_key_of(spank_t sp, char *key, size_t len)
{
	return spank_getenv(sp, AR_KEY_JOB_ENV, key, (int) len) == ESPANK_SUCCESS &&
		ar_valid_key(key) ? 0 : -1;
}

/*
 * The job's two possible checkpoint directories: <root>/<jobid> (primary) and, when the
 * job has a key, <root>/<jobid>.<key> (fallback: the one a squatter cannot guess).
 */
struct ar_ckpt_dirs {
	char key[2 * AR_KEY_BYTES + 1];	/* "" = the job has none */
	char primary[PATH_MAX + 16];
	char fallback[PATH_MAX + 64];	/* "" without a key */
};

static void ar_ckpt_dirs(spank_t sp, uint32_t jobid, struct ar_ckpt_dirs *d)
{
	if (ar_job_key_of(sp, d->key, sizeof(d->key)))
		d->key[0] = '\0';
	snprintf(d->primary, sizeof(d->primary), "%s/%u", cfg.checkpoint_root, jobid);
	d->fallback[0] = '\0';
	if (d->key[0])
		snprintf(d->fallback, sizeof(d->fallback), "%s/%u.%s",
			 cfg.checkpoint_root, jobid, d->key);
}

static int ar_is_ours(const struct ar_ckpt_dirs *d, const char *dir)
{
	return !strcmp(dir, d->primary) || (d->fallback[0] && !strcmp(dir, d->fallback));
}

/*
 * Remote context: the job key applies to the directories the plugin chooses only.  A
 * step whose HYPERPOD_CHECKPOINT_DIR is one of them (set here, or inherited from the
 * batch step) gets the key; any other directory (the job's own choice) gets none, so
 * a chain of jobs sharing one directory is never refused.
 */
static int ar_bind_job_key(spank_t sp, uint32_t jobid)
{
	struct ar_ckpt_dirs d;
	char dir[PATH_MAX + 64];
	spank_err_t err;

	ar_ckpt_dirs(sp, jobid, &d);
	if (d.key[0] &&
	    spank_getenv(sp, "HYPERPOD_CHECKPOINT_DIR", dir, sizeof(dir)) == ESPANK_SUCCESS &&
	    ar_is_ours(&d, dir)) {
		err = spank_setenv(sp, AR_KEY_TASK_ENV, d.key, 1);
		if (err != ESPANK_SUCCESS) {
			ar_error("set %s: %s", AR_KEY_TASK_ENV, spank_strerror(err));
			return -1;
		}
		return 0;
	}
	if ((err = spank_unsetenv(sp, AR_KEY_TASK_ENV)) != ESPANK_SUCCESS) {
		ar_error("unset %s: %s", AR_KEY_TASK_ENV, spank_strerror(err));
		return -1;
	}
	return 0;
}

/*
 * What this step's tasks go without, and why: told to the job in its stderr by the
 * node's first task (slurm_spank_task_init), and to the admin in the slurmd log.
 */
static char ar_notes[2048];
static size_t ar_notes_len;

static void ar_note(const char *fmt, ...) __attribute__ ((format (printf, 1, 2)));

static void ar_note(const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	int n;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	ar_error("%s", msg);
	n = snprintf(ar_notes + ar_notes_len, sizeof(ar_notes) - ar_notes_len,
		     "auto-resume: %s: couldn't %s\n", ar_context(), msg);
	if (n > 0)
		ar_notes_len += (size_t) n < sizeof(ar_notes) - ar_notes_len ?
			(size_t) n : sizeof(ar_notes) - ar_notes_len - 1;
}

/* A node root with each %n replaced by this node's host name (what $(hostname) says
 * in the local cluster's TaskProlog). */
static int ar_expand(const char *tmpl, char *out, size_t len, char *why, size_t wlen)
{
	char host[256] = "", one[2] = "";
	const char *p = tmpl, *add;
	size_t o = 0, n;

	while (*p) {
		if (p[0] == '%' && p[1] == 'n') {
			if (!host[0] &&
			    (gethostname(host, sizeof(host) - 1) < 0 || !host[0] ||
			     strchr(host, '/') || !strcmp(host, ".") || !strcmp(host, ".."))) {
				snprintf(why, wlen, "expand %s: no usable host name", tmpl);
				return -1;
			}
			add = host;
			p += 2;
		} else {
			one[0] = *p++;
			add = one;
		}
		n = strlen(add);
		if (o + n >= len) {
			snprintf(why, wlen, "expand %s: path too long", tmpl);
			return -1;
		}
		memcpy(out + o, add, n);
		o += n;
	}
	out[o] = '\0';
	return 0;
}

/*
 * Remote context, every step: <root>/<jobid> made (or kept) for the job's user, mode
 * 0700.  One that someone else holds is left alone and the job goes without it on this
 * node (the library refuses it too); any other trouble is the admin's (slurmd log),
 * and the job's own library may then make its directory itself, as without the plugin.
 */
static void ar_node_dir(const char *tmpl, const char *what, const char *off,
			uint32_t jobid, uid_t uid, gid_t gid)
{
	char root[PATH_MAX], name[16], why[512];
	enum jd_result r;
	int fd;

	if (!tmpl[0])
		return;
	snprintf(name, sizeof(name), "%u", jobid);
	if (ar_expand(tmpl, root, sizeof(root), why, sizeof(why))) {
		ar_error("make %s for job %u: %s", what, jobid, why);
		return;
	}
	if ((fd = jd_open_root(root, 01777, why, sizeof(why))) < 0) {
		ar_error("make %s %s/%s: %s", what, root, name, why);
		return;
	}
	r = jd_ensure(fd, name, uid, gid, why, sizeof(why));
	close(fd);
	if (r == JD_REFUSED)
		ar_note("make %s %s/%s: %s; left alone: %s for this job on this node",
			what, root, name, why, off);
	else if (r == JD_ERROR)
		ar_error("make %s %s/%s: %s", what, root, name, why);
}

static int ar_set_checkpoint_dir(spank_t sp, const char *dir)
{
	spank_err_t err = dir ? spank_setenv(sp, "HYPERPOD_CHECKPOINT_DIR", dir, 1)
		: spank_unsetenv(sp, "HYPERPOD_CHECKPOINT_DIR");

	if (err != ESPANK_SUCCESS) {
		ar_error("set HYPERPOD_CHECKPOINT_DIR: %s", spank_strerror(err));
		return -1;
	}
	return 0;
}

/* Make <root_fd>/<name> the job's; JD_* as jd_ensure, trouble told. */
static enum jd_result ar_ckpt_ensure(int fd, const char *name, const char *path,
				     uid_t uid, gid_t gid, const char *instead)
{
	char why[512];
	enum jd_result r = jd_ensure(fd, name, uid, gid, why, sizeof(why));

	if (r == JD_REFUSED)
		ar_note("make checkpoint directory %s: %s; left alone: %s", path, why, instead);
	else if (r == JD_ERROR)	/* the library may still make it (root-squashed NFS) */
		ar_error("make checkpoint directory %s: %s", path, why);
	return r;
}

/*
 * Remote context, a step with --auto-resume=N (N > 0): HYPERPOD_CHECKPOINT_DIR, made
 * for the job's user (mode 0700).  Normally <root>/<jobid>.  If someone else holds that
 * name (anyone may make it first in a 1777 root), the job checkpoints to
 * <root>/<jobid>.<key> instead, named after its random key, which nobody else knows
 * before the directory exists; once that one exists every later step and run of the
 * job uses it.  A directory the job chose itself wins, as does an object store.
 */
static int ar_checkpoint_dir(spank_t sp, uint32_t jobid, uid_t uid, gid_t gid)
{
	struct ar_ckpt_dirs d;
	char have[PATH_MAX + 64], name[64], why[512];
	const char *chosen;
	spank_err_t err;
	int fd, set;

	ar_ckpt_dirs(sp, jobid, &d);
	err = spank_getenv(sp, "HYPERPOD_CHECKPOINT_DIR", have, sizeof(have));
	set = err == ESPANK_SUCCESS;
	if (err == ESPANK_NOSPACE || (set && !ar_is_ours(&d, have)))
		return 0;	/* the job's own choice */
	if (!strncmp(cfg.checkpoint_root, "s3://", 5))
		return set ? 0 : ar_set_checkpoint_dir(sp, d.primary);
	if ((fd = jd_open_root(cfg.checkpoint_root, 0, why, sizeof(why))) < 0) {
		ar_error("make checkpoint directory %s: %s", d.primary, why);
		return set ? 0 : ar_set_checkpoint_dir(sp, d.primary);
	}
	snprintf(name, sizeof(name), "%u.%s", jobid, d.key);
	if (d.key[0] && jd_exists(fd, name)) {
		chosen = d.fallback;
		if (ar_ckpt_ensure(fd, name, d.fallback, uid, gid,
				   "this job has no HYPERPOD_CHECKPOINT_DIR") == JD_REFUSED)
			chosen = NULL;
	} else {
		chosen = d.primary;
		snprintf(name, sizeof(name), "%u", jobid);
		if (!d.key[0]) {
			if (ar_ckpt_ensure(fd, name, d.primary, uid, gid,
					   "this job (made without a job key) has no "
					   "HYPERPOD_CHECKPOINT_DIR") == JD_REFUSED)
				chosen = NULL;
		} else if (jd_ensure(fd, name, uid, gid, why, sizeof(why)) == JD_REFUSED) {
			ar_note("make checkpoint directory %s: %s; left alone: this job "
				"checkpoints to %s", d.primary, why, d.fallback);
			snprintf(name, sizeof(name), "%u.%s", jobid, d.key);
			chosen = d.fallback;
			if (ar_ckpt_ensure(fd, name, d.fallback, uid, gid,
					   "this job has no HYPERPOD_CHECKPOINT_DIR")
			    == JD_REFUSED)
				chosen = NULL;
		}
	}
	close(fd);
	return ar_set_checkpoint_dir(sp, chosen);
}

/* slurmstepd, before the tasks start: runs as root with the job id known. */
static int ar_remote_post_opt(spank_t sp)
{
	uint32_t jobid = 0, stepid = 0;
	uid_t uid = 0;
	gid_t gid = 0;
	char val[32];
	spank_err_t err;

	ar_notes_len = 0;
	ar_notes[0] = '\0';
	if ((err = spank_get_item(sp, S_JOB_ID, &jobid)) != ESPANK_SUCCESS ||
	    (err = spank_get_item(sp, S_JOB_STEPID, &stepid)) != ESPANK_SUCCESS ||
	    (err = spank_get_item(sp, S_JOB_UID, &uid)) != ESPANK_SUCCESS ||
	    (err = spank_get_item(sp, S_JOB_GID, &gid)) != ESPANK_SUCCESS) {
		ar_error("get the job's id and user: %s", spank_strerror(err));
		return -1;
	}
	/* Someone else's squatting costs the job a feature on this node, never its run. */
	ar_node_dir(cfg.progress_root, "progress directory", "progress records are off",
		    jobid, uid, gid);
	ar_node_dir(cfg.memory_root, "memory tier directory",
		    "the checkpoint memory tier is off", jobid, uid, gid);
	if (ar_value < 0)	/* a step without the option: only the key's binding */
		return cfg.checkpoint_root[0] ? ar_bind_job_key(sp, jobid) : 0;
	snprintf(val, sizeof(val), "%ld", ar_value);
	if ((err = spank_setenv(sp, "HYPERPOD_AUTO_RESUME", val, 1)) != ESPANK_SUCCESS) {
		ar_error("set HYPERPOD_AUTO_RESUME: %s", spank_strerror(err));
		return -1;
	}
	if (cfg.checkpoint_root[0] && ar_value > 0 && ar_checkpoint_dir(sp, jobid, uid, gid))
		return -1;
	if (cfg.checkpoint_root[0] && ar_bind_job_key(sp, jobid))
		return -1;
	/* A missing marker costs the job its requeue, not its run: the error
	 * is logged for the admin and the step goes on. */
	if (cfg.statedir[0])
		(void) ar_write_marker(jobid, stepid);
	return 0;
}

/*
 * Job epilog (job_script context, root, once per job and node after its last step
 * here).  The progress directory goes with everything in it, removed by a process
 * running as the job's user: its records belong to runs that are over (a requeue
 * starts fresh).  The memory tier directory goes only if it is empty: a requeued job
 * restores from it, and the node agent frees it once Slurm reports the job finished.
 * A directory that is not the job's user's is left alone.  <checkpoint_root>/<jobid>
 * holds the job's checkpoints and is never touched.
 */
static void ar_remove_node_dir(const char *tmpl, const char *what, uint32_t jobid,
			       uid_t uid, int recursive)
{
	char root[PATH_MAX], name[16], why[512];
	enum jd_result r;
	int fd;

	if (!tmpl[0])
		return;
	snprintf(name, sizeof(name), "%u", jobid);
	if (ar_expand(tmpl, root, sizeof(root), why, sizeof(why))) {
		ar_error("remove %s for job %u: %s", what, jobid, why);
		return;
	}
	if ((fd = jd_open_root(root, 0, why, sizeof(why))) < 0) {
		if (errno != ENOENT)	/* no root: nothing to remove */
			ar_error("remove %s %s/%s: %s", what, root, name, why);
		return;
	}
	r = jd_remove(fd, name, uid, recursive, why, sizeof(why));
	close(fd);
	if (r == JD_REFUSED || r == JD_ERROR)
		ar_error("remove %s %s/%s: %s; left alone", what, root, name, why);
}

/*
 * srun's own command line (/proc/self/cmdline: NUL-separated words) into buf,
 * its words into args[first..]; returns the word count, -1 on error.
 */
static int ar_cmdline(char *buf, size_t len, char **args, int first, int max)
{
	FILE *f = fopen("/proc/self/cmdline", "r");
	size_t n, i;
	int argc = 0;

	if (!f)
		return -1;
	n = fread(buf, 1, len - 1, f);
	fclose(f);
	if (n == 0 || n == len - 1)	/* empty, or too long to hand over whole */
		return -1;
	buf[n] = '\0';
	for (i = 0; i < n && first + argc < max - 1; i += strlen(buf + i) + 1)
		args[first + argc++] = buf + i;
	if (i < n)
		return -1;
	args[first + argc] = NULL;
	return argc;
}

static int ar_typed_by_user(char *const *args, int argc)
{
	int i;

	for (i = 1; i < argc; i++) {
		if (!strcmp(args[i], "--"))
			break;
		if (!strcmp(args[i], "--" AR_OPTION) ||
		    !strncmp(args[i], "--" AR_OPTION "=", strlen(AR_OPTION) + 3))
			return 1;
	}
	return 0;
}

/*
 * Local context: an srun with --auto-resume typed on its own command line,
 * inside an allocation, becomes "<step_helper> step-retry -- <srun ...>".
 * Returns only when it does not hand over (or the exec failed: logged).
 */
static void ar_hand_over(void)
{
	static char buf[AR_CMDLINE_MAX];
	static char *args[AR_ARGS_MAX];
	char val[32];
	int argc;

	if (!cfg.step_helper[0] || ar_value <= 0 || !getenv("SLURM_JOB_ID") ||
	    getenv(AR_WRAPPED_ENV))
		return;
	args[0] = "hyperpod";
	args[1] = "step-retry";
	args[2] = "--";
	argc = ar_cmdline(buf, sizeof(buf), args, 3, AR_ARGS_MAX);
	if (argc < 0) {
		ar_error("hand srun over to %s: cannot read its command line; "
			 "running the step without step retry", cfg.step_helper);
		return;
	}
	if (!ar_typed_by_user(args + 3, argc))
		return;
	snprintf(val, sizeof(val), "%ld", ar_value);
	if (setenv(AR_BUDGET_ENV, val, 1) < 0) {
		ar_error("set %s: %s", AR_BUDGET_ENV, strerror(errno));
		return;
	}
	execv(cfg.step_helper, args);
	ar_error("hand srun over to %s: %s; running the step without step retry",
		 cfg.step_helper, strerror(errno));
	unsetenv(AR_BUDGET_ENV);
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	spank_err_t err;

	if (ar_parse_args(ac, av))
		return -1;
	switch (spank_context()) {
	case S_CTX_ALLOCATOR:
	case S_CTX_LOCAL:
	case S_CTX_REMOTE:
		snprintf(ar_usage, sizeof(ar_usage),
			 "Requeue the job on healthy nodes after a node fault, at "
			 "most N times (N: 0..%ld, 0 opts out; --%s alone means "
			 "N=%ld). Attach N with '='.", cfg.max, AR_OPTION, cfg.bare);
		/* Registration (not a static spank_options table) is what makes
		 * the option exist for sbatch and salloc. */
		err = spank_option_register(sp, &ar_option);
		if (err != ESPANK_SUCCESS) {
			ar_error("register --" AR_OPTION ": %s", spank_strerror(err));
			return -1;
		}
		return 0;
	default:
		return 0;
	}
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	char val[32];
	spank_err_t err;

	if (ar_parse_args(ac, av))
		return -1;
	if (spank_context() == S_CTX_LOCAL)
		ar_hand_over();
	switch (spank_context()) {
	case S_CTX_ALLOCATOR:
	case S_CTX_LOCAL:
		if (cfg.checkpoint_root[0] && ar_job_key(sp))
			return -1;
		if (ar_value < 0)
			return 0;
		snprintf(val, sizeof(val), "%ld", ar_value);
		err = spank_job_control_setenv(sp, "AUTO_RESUME", val, 1);
		if (err != ESPANK_SUCCESS) {
			ar_error("set job control env AUTO_RESUME: %s",
				 spank_strerror(err));
			return -1;
		}
		return 0;
	case S_CTX_REMOTE:
		return ar_remote_post_opt(sp);
	default:
		return 0;
	}
}

/*
 * Each task, as the job's user, right before it runs: the node's first task tells the
 * job, in its stderr, what this step goes without and why (ar_note).
 */
int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	int task = -1;

	(void) ac;
	(void) av;
	if (!ar_notes_len || spank_get_item(sp, S_TASK_ID, &task) != ESPANK_SUCCESS ||
	    task != 0)
		return 0;
	(void) ar_write_all(STDERR_FILENO, ar_notes, ar_notes_len);
	return 0;
}

/* See ar_remove_node_dir.  Trouble is logged; it never drains the node. */
int slurm_spank_job_epilog(spank_t sp, int ac, char **av)
{
	uint32_t jobid = 0;
	uid_t uid = 0;
	spank_err_t err;

	if (ar_parse_args(ac, av))
		return -1;
	if (!cfg.progress_root[0] && !cfg.memory_root[0])
		return 0;
	if ((err = spank_get_item(sp, S_JOB_ID, &jobid)) != ESPANK_SUCCESS ||
	    (err = spank_get_item(sp, S_JOB_UID, &uid)) != ESPANK_SUCCESS) {
		ar_error("get the job's id and user: %s", spank_strerror(err));
		return 0;
	}
	ar_remove_node_dir(cfg.progress_root, "progress directory", jobid, uid, 1);
	ar_remove_node_dir(cfg.memory_root, "memory tier directory", jobid, uid, 0);
	return 0;
}
