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
 *   remote (slurmstepd, runs as root, knows the job id):
 *       task env HYPERPOD_AUTO_RESUME=N, HYPERPOD_CHECKPOINT_DIR=<root>/<jobid>
 *       (unless the job set it), and a marker file <statedir>/<jobid> for
 *       steps started with --auto-resume inside a batch script, which the
 *       job_submit hook never sees.
 *
 * plugstack.conf arguments (all optional, each at most once):
 *   statedir=/abs/dir         where slurmstepd writes marker files
 *   checkpoint_root=/abs/dir  parent of HYPERPOD_CHECKPOINT_DIR
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
#include <sys/stat.h>
#include <unistd.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

SPANK_PLUGIN(auto_resume, 1);

#define AR_OPTION "auto-resume"
#define AR_DEFAULT_MAX 1000L
#define AR_LIMIT_MAX 1000000L	/* bound for max= itself */
#define AR_DEFAULT_BARE 1L

struct ar_config {
	char statedir[PATH_MAX];	/* "" = write no marker */
	char checkpoint_root[PATH_MAX];	/* "" = leave HYPERPOD_CHECKPOINT_DIR */
	long max;
	long bare;
};

static struct ar_config cfg = { "", "", AR_DEFAULT_MAX, AR_DEFAULT_BARE };

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

enum ar_key { AR_STATEDIR, AR_CHECKPOINT_ROOT, AR_MAX, AR_DEFAULT, AR_NKEYS };

static const char *const ar_keys[AR_NKEYS] = {
	[AR_STATEDIR] = "statedir",
	[AR_CHECKPOINT_ROOT] = "checkpoint_root",
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
	struct ar_config c = { "", "", AR_DEFAULT_MAX, AR_DEFAULT_BARE };
	int seen[AR_NKEYS] = { 0 };
	int i;

	for (i = 0; i < ac; i++) {
		const char *arg = av[i], *eq = strchr(arg, '=');
		int key = ar_find_key(arg, eq ? (size_t) (eq - arg) : strlen(arg));
		int bad = 0;

		if (key < 0) {
			ar_error("parse plugstack argument '%s': unknown key (known: "
				 "statedir=, checkpoint_root=, max=, default=)", arg);
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
		case AR_CHECKPOINT_ROOT:
			bad = ar_parse_path(arg, eq + 1, c.checkpoint_root,
					    sizeof(c.checkpoint_root));
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

/* slurmstepd, before the tasks start: runs as root with the job id known. */
static int ar_remote_post_opt(spank_t sp)
{
	uint32_t jobid = 0, stepid = 0;
	char val[32], dir[PATH_MAX + 16];
	spank_err_t err;

	if ((err = spank_get_item(sp, S_JOB_ID, &jobid)) != ESPANK_SUCCESS ||
	    (err = spank_get_item(sp, S_JOB_STEPID, &stepid)) != ESPANK_SUCCESS) {
		ar_error("get job id: %s", spank_strerror(err));
		return -1;
	}
	snprintf(val, sizeof(val), "%ld", ar_value);
	if ((err = spank_setenv(sp, "HYPERPOD_AUTO_RESUME", val, 1)) != ESPANK_SUCCESS) {
		ar_error("set HYPERPOD_AUTO_RESUME: %s", spank_strerror(err));
		return -1;
	}
	if (cfg.checkpoint_root[0] && ar_value > 0) {
		snprintf(dir, sizeof(dir), "%s/%u", cfg.checkpoint_root, jobid);
		/* overwrite = 0: a directory the job chose itself wins */
		err = spank_setenv(sp, "HYPERPOD_CHECKPOINT_DIR", dir, 0);
		if (err != ESPANK_SUCCESS && err != ESPANK_ENV_EXISTS) {
			ar_error("set HYPERPOD_CHECKPOINT_DIR: %s", spank_strerror(err));
			return -1;
		}
	}
	/* A missing marker costs the job its requeue, not its run: the error
	 * is logged for the admin and the step goes on. */
	if (cfg.statedir[0])
		(void) ar_write_marker(jobid, stepid);
	return 0;
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
	if (ar_value < 0)
		return 0;
	switch (spank_context()) {
	case S_CTX_ALLOCATOR:
	case S_CTX_LOCAL:
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
