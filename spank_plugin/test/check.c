/*
 * check.c - the plugin's own tests, without Slurm: `make check` (as root).
 *
 * auto_resume.c is compiled in whole and Slurm's functions are stubs below (an
 * environment, a log, the job's ids), so the parsing and the choice of directories run
 * as slurmstepd would run them, under ASan and UBSan.  jobdirs.c runs against scratch
 * directories under /tmp, owned by made-up uids (no passwd entry needed).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <slurm/spank.h>

#include "auto_resume.c"

#define USER 12345	/* the job's user */
#define OTHER 12346	/* someone else */

static int failures, checks;

#define CHECK(cond) check(!!(cond), #cond, __FILE__, __LINE__)

static void check(int ok, const char *what, const char *file, int line)
{
	checks++;
	if (!ok) {
		failures++;
		fprintf(stderr, "%s:%d: FAILED: %s\n", file, line, what);
	}
}

/* --- Slurm, stubbed -------------------------------------------------------------- */

static spank_context_t stub_ctx = S_CTX_REMOTE;
static char stub_log[8192];
static char *stub_env[32];
static uint32_t stub_job = 17;
static int stub_task = 0;

void slurm_error(const char *fmt, ...)
{
	size_t n = strlen(stub_log);
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(stub_log + n, sizeof(stub_log) - n, fmt, ap);
	va_end(ap);
	n = strlen(stub_log);
	snprintf(stub_log + n, sizeof(stub_log) - n, "\n");
}

spank_context_t spank_context(void)
{
	return stub_ctx;
}

const char *spank_strerror(spank_err_t err)
{
	(void) err;
	return "stub error";
}

spank_err_t spank_option_register(spank_t sp, struct spank_option *opt)
{
	(void) sp;
	(void) opt;
	return ESPANK_SUCCESS;
}

spank_err_t spank_option_getopt(spank_t sp, struct spank_option *opt, char **arg)
{
	(void) sp;
	(void) opt;
	(void) arg;
	return ESPANK_NOT_AVAIL;
}

spank_err_t spank_job_control_setenv(spank_t sp, const char *n, const char *v, int o)
{
	(void) sp;
	(void) n;
	(void) v;
	(void) o;
	return ESPANK_SUCCESS;
}

spank_err_t spank_get_item(spank_t sp, spank_item_t item, ...)
{
	va_list ap;
	spank_err_t rc = ESPANK_SUCCESS;

	(void) sp;
	va_start(ap, item);
	switch (item) {
	case S_JOB_ID:
		*va_arg(ap, uint32_t *) = stub_job;
		break;
	case S_JOB_STEPID:
		*va_arg(ap, uint32_t *) = 0;
		break;
	case S_JOB_UID:
		*va_arg(ap, uid_t *) = USER;
		break;
	case S_JOB_GID:
		*va_arg(ap, gid_t *) = USER;
		break;
	case S_TASK_ID:
		*va_arg(ap, int *) = stub_task;
		break;
	default:
		rc = ESPANK_BAD_ARG;
	}
	va_end(ap);
	return rc;
}

static char **stub_find(const char *var)
{
	size_t n = strlen(var), i;

	for (i = 0; i < sizeof(stub_env) / sizeof(stub_env[0]); i++)
		if (stub_env[i] && !strncmp(stub_env[i], var, n) && stub_env[i][n] == '=')
			return &stub_env[i];
	return NULL;
}

spank_err_t spank_getenv(spank_t sp, const char *var, char *buf, int len)
{
	char **e = stub_find(var);

	(void) sp;
	if (!e)
		return ESPANK_ENV_NOEXIST;
	if (strlen(*e + strlen(var) + 1) >= (size_t) len)
		return ESPANK_NOSPACE;
	strcpy(buf, *e + strlen(var) + 1);
	return ESPANK_SUCCESS;
}

spank_err_t spank_unsetenv(spank_t sp, const char *var)
{
	char **e = stub_find(var);

	(void) sp;
	if (e) {
		free(*e);
		*e = NULL;
	}
	return ESPANK_SUCCESS;
}

spank_err_t spank_setenv(spank_t sp, const char *var, const char *val, int overwrite)
{
	size_t i;

	if (stub_find(var)) {
		if (!overwrite)
			return ESPANK_ENV_EXISTS;
		spank_unsetenv(sp, var);
	}
	for (i = 0; stub_env[i]; i++)
		;
	stub_env[i] = malloc(strlen(var) + strlen(val) + 2);
	sprintf(stub_env[i], "%s=%s", var, val);
	return ESPANK_SUCCESS;
}

static void stub_reset(void)
{
	size_t i;

	for (i = 0; i < sizeof(stub_env) / sizeof(stub_env[0]); i++) {
		free(stub_env[i]);
		stub_env[i] = NULL;
	}
	stub_log[0] = '\0';
	ar_value = -1;
}

static const char *stub_get(const char *var)
{
	char **e = stub_find(var);

	return e ? *e + strlen(var) + 1 : NULL;
}

/* Run fn (a SPANK callback) on arguments in heap blocks of their exact size, as Slurm
 * hands them over. */
static int with_args(const char *line, spank_f *fn)
{
	char *copy = strdup(line), *save = NULL, *tok, *av[16];
	int ac = 0, rc, i;

	for (tok = strtok_r(copy, " ", &save); tok && ac < 16; tok = strtok_r(NULL, " ", &save))
		av[ac++] = strdup(tok);
	stub_log[0] = '\0';
	rc = fn(NULL, ac, av);
	for (i = 0; i < ac; i++)
		free(av[i]);
	free(copy);
	return rc;
}

static int parse_only(spank_t sp, int ac, char **av)
{
	(void) sp;
	return ar_parse_args(ac, av);
}

static int parse(const char *line)
{
	return with_args(line, parse_only);
}

/* --- plugstack arguments ----------------------------------------------------------- */

static void test_parse(void)
{
	stub_ctx = S_CTX_ALLOCATOR;
	/* a value shorter than "s3://" is not read past its end (ASan) */
	CHECK(parse("checkpoint_root=x") == -1);
	CHECK(strstr(stub_log, "'checkpoint_root=x': want an absolute path or s3://"));
	CHECK(parse("checkpoint_root=s3") == -1);
	CHECK(parse("checkpoint_root=s3://ckpt/a") == 0);
	CHECK(parse("progress_root=/dev/shm/p/%n memory_root=/dev/shm/m") == 0);
	CHECK(!strcmp(cfg.progress_root, "/dev/shm/p/%n"));
	CHECK(!strcmp(cfg.memory_root, "/dev/shm/m"));
	CHECK(parse("progress_root=/x/%d") == -1);
	CHECK(strstr(stub_log, "'progress_root=/x/%d': want an absolute path (%n"));
	CHECK(parse("progress_root=/x/%") == -1);
	CHECK(parse("memory_root=shm") == -1);
	CHECK(strstr(stub_log, "'memory_root=shm': want an absolute path"));
	CHECK(parse("memory_root=/a memory_root=/b") == -1);
	CHECK(strstr(stub_log, "memory_root= given twice"));
	CHECK(parse("bogus=1") == -1);
	CHECK(strstr(stub_log, "progress_root=, memory_root="));
	stub_ctx = S_CTX_REMOTE;
}

static void test_expand(void)
{
	char out[64], why[128], host[256] = "", want[300];

	gethostname(host, sizeof(host) - 1);
	snprintf(want, sizeof(want), "/shm/%s/x", host);
	CHECK(ar_expand("/shm/%n/x", out, sizeof(out), why, sizeof(why)) == 0);
	CHECK(!strcmp(out, want));
	CHECK(ar_expand("/plain", out, sizeof(out), why, sizeof(why)) == 0);
	CHECK(!strcmp(out, "/plain"));
	CHECK(ar_expand("/0123456789012345678901234567890123456789012345678901234567890123",
			out, sizeof(out), why, sizeof(why)) == -1);
	CHECK(strstr(why, "path too long"));
}

/* --- directories --------------------------------------------------------------------- */

static char scratch[64];

static void path(char *buf, size_t len, const char *rel)
{
	snprintf(buf, len, "%s/%s", scratch, rel);
}

static void mk(const char *rel, mode_t mode, uid_t uid)
{
	char p[256];

	path(p, sizeof(p), rel);
	if (mkdir(p, mode) < 0 || chmod(p, mode) < 0 || chown(p, uid, uid) < 0)
		fprintf(stderr, "setup %s: %s\n", p, strerror(errno));
}

static void touch(const char *rel, uid_t uid)
{
	char p[256];
	int fd;

	path(p, sizeof(p), rel);
	if ((fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644)) < 0 || fchown(fd, uid, uid) < 0)
		fprintf(stderr, "setup %s: %s\n", p, strerror(errno));
	if (fd >= 0)
		close(fd);
}

static int owned(const char *rel, uid_t uid, mode_t mode)
{
	char p[256];
	struct stat st;

	path(p, sizeof(p), rel);
	return lstat(p, &st) == 0 && st.st_uid == uid && (st.st_mode & 07777) == mode;
}

static int gone(const char *rel)
{
	char p[256];
	struct stat st;

	path(p, sizeof(p), rel);
	return lstat(p, &st) < 0 && errno == ENOENT;
}

static int root_fd(const char *rel)
{
	char p[256], why[256];

	path(p, sizeof(p), rel);
	return jd_open_root(p, 0, why, sizeof(why));
}

static void test_open_root(void)
{
	char p[256], why[256];
	int fd;

	mk("root", 01777, 0);
	fd = root_fd("root");
	CHECK(fd >= 0);
	close(fd);
	/* a root made by a user, one open to others without the sticky bit, a link */
	mk("users", 01777, OTHER);
	path(p, sizeof(p), "users");
	CHECK(jd_open_root(p, 0, why, sizeof(why)) == -1);
	CHECK(strstr(why, "users belongs to uid 12346, not root"));
	mk("open", 0777, 0);
	path(p, sizeof(p), "open/");
	CHECK(jd_open_root(p, 0, why, sizeof(why)) == -1);
	CHECK(strstr(why, "open is writable by others without the sticky bit (mode 0777)"));
	path(p, sizeof(p), "link");
	CHECK(symlink("root", p) == 0);
	CHECK(jd_open_root(p, 0, why, sizeof(why)) == -1);
	CHECK(strstr(why, "link is a symbolic link"));
	path(p, sizeof(p), "link/below");
	CHECK(jd_open_root(p, 01777, why, sizeof(why)) == -1);
	/* a missing root: made (mode exact whatever the umask) only when asked */
	path(p, sizeof(p), "root/made");
	CHECK(jd_open_root(p, 0, why, sizeof(why)) == -1 && errno == ENOENT);
	umask(077);
	fd = jd_open_root(p, 01777, why, sizeof(why));
	umask(022);
	CHECK(fd >= 0);
	close(fd);
	CHECK(owned("root/made", 0, 01777));
	path(p, sizeof(p), "root/missing/made");
	CHECK(jd_open_root(p, 01777, why, sizeof(why)) == -1 && errno == ENOENT);
}

static void test_ensure(void)
{
	char why[256];
	int fd = root_fd("root");

	/* made for the job's user, private; kept as it is on the next step */
	CHECK(jd_ensure(fd, "17", USER, USER, why, sizeof(why)) == JD_OK);
	CHECK(owned("root/17", USER, 0700));
	touch("root/17/0.prog", USER);
	CHECK(jd_ensure(fd, "17", USER, USER, why, sizeof(why)) == JD_OK);
	CHECK(owned("root/17/0.prog", USER, 0644));
	mk("root/18", 0755, USER);	/* the user's own, closed to others: theirs */
	CHECK(jd_ensure(fd, "18", USER, USER, why, sizeof(why)) == JD_OK);
	CHECK(owned("root/18", USER, 0755));
	/* someone else's first: refused, never chowned, never changed */
	mk("root/19", 0700, OTHER);
	touch("root/19/0.prog", OTHER);
	CHECK(jd_ensure(fd, "19", USER, USER, why, sizeof(why)) == JD_REFUSED);
	CHECK(!strcmp(why, "belongs to uid 12346, not to the job's user (uid 12345)"));
	CHECK(owned("root/19", OTHER, 0700) && owned("root/19/0.prog", OTHER, 0644));
	mk("root/20", 0770, USER);
	CHECK(jd_ensure(fd, "20", USER, USER, why, sizeof(why)) == JD_REFUSED);
	CHECK(!strcmp(why, "others may write in it (mode 0770)"));
	CHECK(owned("root/20", USER, 0770));
	CHECK(symlinkat("17", fd, "21") == 0);
	CHECK(jd_ensure(fd, "21", USER, USER, why, sizeof(why)) == JD_REFUSED);
	CHECK(!strcmp(why, "a symbolic link"));
	touch("root/22", OTHER);
	CHECK(jd_ensure(fd, "22", USER, USER, why, sizeof(why)) == JD_REFUSED);
	CHECK(!strcmp(why, "not a directory"));
	/* root's: empty and private is another step's, half made; anything else is not */
	mk("root/23", 0700, 0);
	CHECK(jd_ensure(fd, "23", USER, USER, why, sizeof(why)) == JD_OK);
	CHECK(owned("root/23", USER, 0700));
	mk("root/24", 0700, 0);
	touch("root/24/secret", 0);
	CHECK(jd_ensure(fd, "24", USER, USER, why, sizeof(why)) == JD_REFUSED);
	CHECK(owned("root/24", 0, 0700));
	mk("root/25", 0755, 0);
	CHECK(jd_ensure(fd, "25", USER, USER, why, sizeof(why)) == JD_REFUSED);
	CHECK(!strcmp(why, "belongs to root with mode 0755"));
	/* a root job: its directory is root's */
	CHECK(jd_ensure(fd, "26", 0, 0, why, sizeof(why)) == JD_OK);
	CHECK(owned("root/26", 0, 0700));
	close(fd);
}

static void test_remove(void)
{
	char why[256], p[256];
	int fd = root_fd("root"), i;

	CHECK(jd_remove(fd, "40", USER, 1, why, sizeof(why)) == JD_OK);	/* none */
	/* someone else's, a link: left alone */
	CHECK(jd_remove(fd, "19", USER, 1, why, sizeof(why)) == JD_REFUSED);
	CHECK(owned("root/19/0.prog", OTHER, 0644));
	CHECK(jd_remove(fd, "21", USER, 1, why, sizeof(why)) == JD_REFUSED);
	CHECK(owned("root/17/0.prog", USER, 0644));
	/* a whole tree, as the user: a link inside goes, never what it points to */
	mk("root/17/sub", 0700, USER);
	touch("root/17/sub/f", USER);
	touch("outside", OTHER);
	path(p, sizeof(p), "outside");
	CHECK(symlinkat(p, fd, "17/sub/link") == 0);
	CHECK(jd_remove(fd, "17", USER, 1, why, sizeof(why)) == JD_OK);
	CHECK(gone("root/17") && owned("outside", OTHER, 0644));
	/* what the user could not remove themselves stays */
	mk("root/41", 0700, USER);
	mk("root/41/theirs", 0755, OTHER);
	touch("root/41/theirs/f", OTHER);
	CHECK(jd_remove(fd, "41", USER, 1, why, sizeof(why)) == JD_ERROR);
	CHECK(strstr(why, "remove as uid 12345: Permission denied"));
	CHECK(owned("root/41/theirs/f", OTHER, 0644));
	/* only if empty: the memory tier a requeue restores from stays */
	mk("root/42", 0700, USER);
	touch("root/42/shard", USER);
	CHECK(jd_remove(fd, "42", USER, 0, why, sizeof(why)) == JD_KEPT);
	CHECK(owned("root/42/shard", USER, 0644));
	CHECK(jd_remove(fd, "23", USER, 0, why, sizeof(why)) == JD_OK && gone("root/23"));
	/* a tree deeper than the bound is left, not followed down the stack */
	mk("root/43", 0700, USER);
	strcpy(p, "root/43");
	for (i = 0; i < JD_MAX_DEPTH + 3; i++) {
		strcat(p, "/d");
		mk(p, 0700, USER);
	}
	CHECK(jd_remove(fd, "43", USER, 1, why, sizeof(why)) == JD_ERROR);
	CHECK(!gone("root/43"));
	close(fd);
}

/* --- the checkpoint directory a step gets ------------------------------------------ */

#define KEY "0123456789abcdef0123456789abcdef"

static const char *ckpt_step(uint32_t job, int keyed, const char *preset)
{
	char arg[128];

	stub_reset();
	snprintf(arg, sizeof(arg), "checkpoint_root=%s/ckpt", scratch);
	CHECK(parse(arg) == 0);
	stub_job = job;
	ar_value = 1;
	if (keyed)
		spank_setenv(NULL, AR_KEY_JOB_ENV, KEY, 1);
	if (preset)
		spank_setenv(NULL, "HYPERPOD_CHECKPOINT_DIR", preset, 1);
	CHECK(ar_remote_post_opt(NULL) == 0);
	return stub_get("HYPERPOD_CHECKPOINT_DIR");
}

static int is(const char *got, const char *rel)
{
	char p[256];

	path(p, sizeof(p), rel);
	return got && !strcmp(got, p);
}

static void test_checkpoint_dir(void)
{
	char p[256];

	mk("ckpt", 01777, 0);
	/* the usual: <root>/<jobid>, made for the user, with the key bound to it */
	CHECK(is(ckpt_step(30, 1, NULL), "ckpt/30"));
	CHECK(owned("ckpt/30", USER, 0700));
	CHECK(!strcmp(stub_get(AR_KEY_TASK_ENV), KEY));
	CHECK(ar_notes_len == 0);
	/* squatted: left alone; the job checkpoints to the directory named after its key */
	mk("ckpt/31", 0700, OTHER);
	CHECK(is(ckpt_step(31, 1, NULL), "ckpt/31." KEY));
	CHECK(owned("ckpt/31", OTHER, 0700) && owned("ckpt/31." KEY, USER, 0700));
	CHECK(!strcmp(stub_get(AR_KEY_TASK_ENV), KEY));
	CHECK(strstr(ar_notes, "auto-resume: remote: couldn't make checkpoint directory "));
	CHECK(strstr(ar_notes, "ckpt/31: belongs to uid 12346, not to the job's user "
		     "(uid 12345); left alone: this job checkpoints to "));
	/* and keeps it for every later step and run, inherited or not */
	path(p, sizeof(p), "ckpt/31");
	CHECK(is(ckpt_step(31, 1, p), "ckpt/31." KEY));
	CHECK(is(ckpt_step(31, 1, NULL), "ckpt/31." KEY));
	CHECK(ar_notes_len == 0);
	/* no key (a job from before checkpoint_root=): no directory rather than theirs */
	mk("ckpt/32", 0700, OTHER);
	CHECK(ckpt_step(32, 0, NULL) == NULL);
	CHECK(strstr(ar_notes, "left alone: this job (made without a job key) has no "
		     "HYPERPOD_CHECKPOINT_DIR"));
	CHECK(stub_get(AR_KEY_TASK_ENV) == NULL);
	/* the job's own choice is not touched */
	CHECK(!strcmp(ckpt_step(33, 1, "/data/mine"), "/data/mine"));
	CHECK(gone("ckpt/33") && stub_get(AR_KEY_TASK_ENV) == NULL);
}

/* How many times task task_init writes the notes to the task's stderr. */
static int told(int task)
{
	char buf[4096] = "";
	const char *at;
	int fds[2], saved = dup(STDERR_FILENO), n = 0;

	if (pipe(fds) < 0 || saved < 0)
		return -1;
	dup2(fds[1], STDERR_FILENO);
	stub_task = task;
	CHECK(slurm_spank_task_init(NULL, 0, NULL) == 0);
	stub_task = 0;
	dup2(saved, STDERR_FILENO);
	close(saved);
	close(fds[1]);
	if (read(fds[0], buf, sizeof(buf) - 1) < 0)
		n = -1;
	close(fds[0]);
	for (at = buf; (at = strstr(at, "couldn't make progress directory")); at++)
		n++;
	return n;
}

static void test_node_dirs_and_notes(void)
{
	char arg[256];
	stub_reset();
	mk("shm", 01777, 0);
	mk("shm/50", 0700, OTHER);
	snprintf(arg, sizeof(arg), "progress_root=%s/shm memory_root=%s/mem", scratch,
		 scratch);
	CHECK(parse(arg) == 0);
	stub_job = 50;
	CHECK(ar_remote_post_opt(NULL) == 0);
	/* the memory root was missing: made root's, 1777, with the job's directory */
	CHECK(owned("mem", 0, 01777) && owned("mem/50", USER, 0700));
	CHECK(owned("shm/50", OTHER, 0700));
	CHECK(strstr(ar_notes, "couldn't make progress directory "));
	CHECK(strstr(ar_notes, "shm/50: belongs to uid 12346, not to the job's user (uid "
		     "12345); left alone: progress records are off for this job on this "
		     "node\n"));
	CHECK(strstr(stub_log, "shm/50: belongs to uid 12346"));
	/* the node's first task tells the job; the others say nothing */
	CHECK(told(1) == 0);
	CHECK(told(0) == 1);
	/* the epilog: progress gone with its records, memory kept while it holds data */
	stub_ctx = S_CTX_JOB_SCRIPT;
	mk("shm/51", 0700, USER);
	touch("shm/51/0.prog", USER);
	mk("mem/51", 0700, USER);
	touch("mem/51/shard", USER);
	stub_job = 51;
	CHECK(with_args(arg, slurm_spank_job_epilog) == 0);
	CHECK(gone("shm/51") && owned("mem/51/shard", USER, 0644));
	stub_job = 50;
	CHECK(with_args(arg, slurm_spank_job_epilog) == 0);
	CHECK(owned("shm/50", OTHER, 0700) && gone("mem/50"));
	CHECK(strstr(stub_log, "auto-resume: job_script: couldn't remove progress directory "));
	stub_ctx = S_CTX_REMOTE;
}

int main(void)
{
	char cmd[128];

	test_parse();
	test_expand();
	if (geteuid() != 0) {
		printf("directory checks skipped: they need root\n");
	} else {
		strcpy(scratch, "/tmp/ar-check-XXXXXX");
		if (!mkdtemp(scratch)) {
			perror("mkdtemp");
			return 2;
		}
		test_open_root();
		test_ensure();
		test_remove();
		test_checkpoint_dir();
		test_node_dirs_and_notes();
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", scratch);
		if (system(cmd) != 0)
			fprintf(stderr, "couldn't remove %s\n", scratch);
	}
	printf("%d checks, %d failed\n", checks, failures);
	return failures ? 1 : 0;
}
