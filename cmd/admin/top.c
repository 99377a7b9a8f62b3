/* SPDX-License-Identifier: MIT */
/*
 * top.c: rb-admin top (top.h): the terminal and the loop; each frame
 * reads rb_admin_stats and rb_admin_lanes, and top_frame.c makes its
 * lines.  The terminal: the alternate screen, no echo, no
 * line buffering, the cursor hidden; all of it restored at exit, on q, on
 * SIGINT, SIGTERM, SIGHUP and on a fatal error (atexit).  Frames are 80
 * columns wide at most, cut to the window's size.
 */
#include "config.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <jansson.h>

#include "rb_admin.h"
#include "rb_cli.h"
#include "rb_exit.h"
#include "rb_log.h"
#include "rb_store.h"
#include "rb_util.h"
#include "top.h"
#include "top_int.h"

static struct termios saved_tio;
static bool tty_raw;
static volatile sig_atomic_t stop_sig;

static void
tty_restore(void)
{
	if (!tty_raw)
		return;
	tty_raw = false;
	fputs("\033[?25h\033[?1049l", stdout);
	fflush(stdout);
	tcsetattr(STDIN_FILENO, TCSAFLUSH, &saved_tio);
}

static void
on_stop(int sig)
{
	stop_sig = sig;
}

static void
tty_setup(void)
{
	struct termios t;
	struct sigaction sa;

	if (tcgetattr(STDIN_FILENO, &saved_tio) < 0)
		rb_die_errno(RB_EXIT_USAGE, "top: standard input is not a terminal (use --once)");
	t = saved_tio;
	t.c_lflag &= ~(tcflag_t)(ICANON | ECHO);	/* (ISIG stays: ^C is SIGINT) */
	t.c_cc[VMIN] = 0;
	t.c_cc[VTIME] = 0;
	if (tcsetattr(STDIN_FILENO, TCSAFLUSH, &t) < 0)
		rb_die_errno(RB_EXIT_OSERR, "top: cannot set the terminal");
	tty_raw = true;
	atexit(tty_restore);
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_stop;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	/* the alternate screen, the cursor hidden */
	fputs("\033[?1049h\033[?25l", stdout);
}

int
admin_top(struct rb_store *s, const char *schema, const char *handler, bool once, int64_t interval_ms)
{
	char pickbuf[64], pickbuf2[64];
	const char *pick = handler;
	json_t *st = NULL;

	if (!once) {
		if (!isatty(STDOUT_FILENO))
			rb_die(RB_EXIT_USAGE, "top: standard output is not a terminal (use --once)");
		tty_setup();
	}
	for (;;) {
		struct rb_error err = { 0 };
		json_t *lanes = NULL;
		struct frame f = { 0 };
		struct winsize ws = { 0 };
		int rows = 24, cols = TOP_WIDTH;

		json_decref(st);
		if (rb_admin_stats(s, &st, &err) < 0 || rb_admin_lanes(s, NULL, false, &lanes, &err) < 0) {
			tty_restore();
			rb_cli_die(&err);
		}
		if (!once && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0) {
			rows = ws.ws_row;
			cols = ws.ws_col < TOP_WIDTH ? ws.ws_col : TOP_WIDTH;
		}
		frame_build(&f, st, lanes, schema, pick, once ? 0 : (double)interval_ms / 1000.0,
		    once ? 0 : rows);
		json_decref(lanes);
		if (once) {
			for (int i = 0; i < f.n; i++)
				printf("%s\n", f.line[i]);
			frame_free(&f);
			break;
		}
		/* home, each line cleared to its end, the rest of the screen cleared */
		fputs("\033[H", stdout);
		for (int i = 0; i < f.n && i < rows; i++)
			printf("%.*s\033[K%s", cols, f.line[i], i + 1 < rows ? "\r\n" : "");
		fputs("\033[J", stdout);
		fflush(stdout);
		frame_free(&f);
		/* keys until the next frame */
		for (int64_t until = rb_mono_ms() + interval_ms; !stop_sig;) {
			struct pollfd p = { .fd = STDIN_FILENO, .events = POLLIN };
			int64_t left = until - rb_mono_ms();
			char c;

			if (left <= 0)
				break;
			if (poll(&p, 1, (int)left) <= 0)
				continue;
			if (read(STDIN_FILENO, &c, 1) != 1) {
				(void)poll(NULL, 0, (int)left);	/* (no more keys: wait for the frame) */
				continue;
			}
			if (c == 'q' || c == 'Q') {
				stop_sig = -1;
				break;
			}
			if (c == 'h' || c == 'H') {
				pick = next_handler(st, pick, pick == pickbuf ? pickbuf2 : pickbuf,
				    sizeof pickbuf);
				break;	/* at once, new rates from here */
			}
		}
		if (stop_sig)
			break;
	}
	json_decref(st);
	tty_restore();
	return 0;
}
